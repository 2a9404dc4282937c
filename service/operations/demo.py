"""`cdc-lakehouse demo`: the embedded default, end to end on one machine.

Starts a local broker in a temporary directory, produces a small Debezium workload
(snapshot reads, inserts, updates, deletes with tombstones), runs the pipeline until
idle, prints the resulting Delta table and where it is, and stops the broker.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from deltalake import DeltaTable

from connectors.kafka.local_broker import LocalBroker
from service.config.settings import settings_from_mapping
from service.operations.workload import DebeziumWorkload, create_topics, produce
from service.supervisor.runner import run

DEMO_TOPIC = "demo.inventory.customers"
DEMO_TABLE = "customers"


def demo(output: Path, events: int, keys: int) -> bool:
    """Run the demo; True when the table equals the replay of the events."""
    if output.exists():
        shutil.rmtree(output)
    output.mkdir(parents=True)
    broker_dir = Path(tempfile.mkdtemp(prefix="cdc-lakehouse-broker-"))
    try:
        with LocalBroker(broker_dir) as broker:
            workload = DebeziumWorkload(DEMO_TOPIC, partitions=4, schema="always", seed=7, with_timestamp=True)
            create_topics(broker.bootstrap_servers, [DEMO_TOPIC], 4)
            produced = produce(broker.bootstrap_servers, workload.generate(events, keys))
            print(f"produced {produced} Debezium records to {DEMO_TOPIC} on {broker.bootstrap_servers}")
            settings = settings_from_mapping({
                "kafka": {"bootstrap_servers": broker.bootstrap_servers},
                "lakehouse": {"root": str(output / "tables")},
                "checkpoint_root": str(output / "checkpoints"),
                "spark": {"master": "local[2]"},
                "pipelines": [{"name": "customers", "topics": [DEMO_TOPIC], "table": DEMO_TABLE,
                               "primary_key": ["id"]}],
            }, "demo")
            run(settings, until_idle=True)
    finally:
        shutil.rmtree(broker_dir, ignore_errors=True)
    uri = settings.lakehouse.table_uri(DEMO_TABLE)
    table = DeltaTable(uri)
    frame = table.to_pandas().sort_values("id").reset_index(drop=True)
    print(frame.head(20).to_string())
    print(f"... {len(frame)} rows, Delta version {table.version()}, change data feed on")
    print(f"table: {Path(uri).resolve()}")
    matches = frame.to_dict("records") == workload.expected_rows()
    print("table equals the replay of the events" if matches else "TABLE DIFFERS from the replay of the events")
    return matches
