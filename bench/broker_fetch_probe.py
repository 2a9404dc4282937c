"""How much a Kafka range read costs depending on what follows it in the partition.

Produces a short topic (25,000 records) and a long one (200,000), then reads 25,000 records with
the service's range reader (`connectors.kafka.range_reader.read_range`, a fresh consumer per
range, as each Spark task does): the whole short partition, and ranges at the start, middle and
end of the long one. Each read runs in a child process, which prints its wall time and peak RSS:
a broker that bounds a fetch by `fetch.max.bytes` / `max.partition.fetch.bytes` gives the same
figures everywhere; one that answers with the rest of the partition makes early ranges cost more.

    .venv/bin/python bench/broker_fetch_probe.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from connectors.kafka.local_broker import LocalBroker  # noqa: E402
from service.operations.workload import DebeziumWorkload, create_topics, produce  # noqa: E402

RANGE = 25_000
_CHILD = """
import resource, sys, time
from connectors.kafka.range_reader import read_range
bootstrap, topic, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
began = time.perf_counter()
rows = sum(b.num_rows for b in read_range({"bootstrap.servers": bootstrap}, topic, 0, start, start + %d))
print(f"{rows} records in {time.perf_counter() - began:.2f} s, peak RSS "
      f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB")
""" % RANGE


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, LocalBroker(str(Path(tmp) / "broker")) as broker:
        bootstrap = broker.bootstrap_servers
        create_topics(bootstrap, ["probe.short", "probe.long"], 1)
        produce(bootstrap, DebeziumWorkload("probe.short", 1, "mixed", seed=1).generate(RANGE, 8_000))
        produce(bootstrap, DebeziumWorkload("probe.long", 1, "mixed", seed=1).generate(200_000, 60_000))
        root = str(Path(__file__).resolve().parents[1])
        for topic, start in (("probe.short", 0), ("probe.long", 0), ("probe.long", 100_000), ("probe.long", 175_000)):
            done = subprocess.run([sys.executable, "-c", _CHILD, bootstrap, topic, str(start)], cwd=root,
                                  capture_output=True, text=True, check=True)
            print(f"{topic:<12} records [{start:,}, {start + RANGE:,}): {done.stdout.strip()}", flush=True)


if __name__ == "__main__":
    main()
