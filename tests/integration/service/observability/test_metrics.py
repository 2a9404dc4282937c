"""Pipeline counters served over HTTP in the Prometheus text format."""

from __future__ import annotations

import json
import urllib.request

from connectors.kafka.local_broker import free_port
from service.config.settings import settings_from_mapping
from service.operations.workload import DebeziumWorkload, create_topics, produce
from service.supervisor.runner import Runner


def _sample(text: str, name: str, pipeline: str, extra: str = "") -> float:
    prefix = f'{name}{{pipeline="{pipeline}"{extra}}} '
    (line,) = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(line[len(prefix):])


def test_metrics_count_changes_upserts_deletes_and_batches(spark, kafka_bootstrap, unique, workdir):
    workload = DebeziumWorkload(f"metrics-{unique}", 2, "never", seed=11)
    create_topics(kafka_bootstrap, [workload.topic], 2)
    events = workload.generate(600, 60)
    produce(kafka_bootstrap, events)
    port = free_port()
    name = f"m{unique}"
    settings = settings_from_mapping({
        "kafka": {"bootstrap_servers": kafka_bootstrap},
        "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"),
        "metrics_port": port, "metrics_address": "127.0.0.1",
        "pipelines": [{"name": name, "topics": [workload.topic], "table": "t", "primary_key": ["id"]}],
    })
    runner = Runner(settings)
    runner.start(until_idle=True)
    runner.wait()
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    # The debezium preset turns an update with a before image into two changelog rows (-U, +U).
    envelopes = [json.loads(e.value) for e in events if e.value is not None]
    changes = sum(2 if e["op"] == "u" and e.get("before") else 1 for e in envelopes)
    outcome = runner.pipelines[0].last_outcome
    assert _sample(text, "cdc_changes_total", name) == changes
    assert _sample(text, "cdc_upserts_total", name) == outcome.upserts == len(workload.table)
    assert _sample(text, "cdc_deletes_total", name) == outcome.deletes
    assert _sample(text, "cdc_batches_total", name, ',result="committed"') == 1
    assert _sample(text, "cdc_decode_errors_total", name) == 0
    assert _sample(text, "cdc_last_committed_batch", name) == 0
