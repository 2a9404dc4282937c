"""Probe: one steady micro-batch's reading side of a database source, outside Spark (issue 24).

Creates `--tables` topics of `--partitions` partitions (`probe<seed>.public.tNNN`) on the broker of
KAFKA_BOOTSTRAP / `--bootstrap`, produces `--records` Debezium JSON changes spread at random over
them (the database benchmark's `TableWorkload`), then reads every partition's range the two ways a
task can, each timed over the same ranges:

- per range: `range_reader.read_values` (a consumer per range), the records only;
- one consumer: `range_reader.read_values_of_ranges` over all ranges at once, the records only;
- and each of them followed by the database source's decode and reduce (`TableReducers`), range by range;
- one consumer, then each table's ranges decoded and reduced as one chunk (`TableReducers.joined`; a table
  it gives back is decoded range by range);
- one consumer, then what a task does now (`database_ranges.task_payloads`): the tables that decode alike
  in one call keyed by table (`joint_tables`), the others as above.

Prints seconds, ms per range and this process's CPU seconds (the consumers' own threads included).
Nothing is asserted; the figures go to bench/README.md.

    KAFKA_BOOTSTRAP=$(cat /tmp/devbroker.addr) .venv/bin/python bench/database_read_probe.py
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from database_benchmark import Clock, TableWorkload  # noqa: E402

from connectors.kafka.cluster import ClusterView  # noqa: E402
from connectors.kafka.range_reader import read_values, read_values_of_ranges  # noqa: E402
from connectors.kafka.source import KafkaRange  # noqa: E402
from service.config.databases import DatabaseSettings  # noqa: E402
from service.kafka_to_delta.source.database_ranges import TableReducers, task_payloads  # noqa: E402
from service.operations.workload import create_topics, produce  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP"))
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--records", type=int, default=4_000, help="changes over all tables")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    if not args.bootstrap:
        sys.exit("set --bootstrap or KAFKA_BOOTSTRAP")
    prefix = f"probe{args.seed}"
    rng, clock = random.Random(args.seed), Clock()
    workloads = [TableWorkload(f"{prefix}.public.t{i:03d}", f"t{i:03d}", args.partitions, 250, clock, rng)
                 for i in range(args.tables)]
    create_topics(args.bootstrap, [w.topic for w in workloads], args.partitions)
    produce(args.bootstrap, (e for _ in range(args.records) for e in rng.choice(workloads).change(rng.randrange(250))))
    cluster = ClusterView({"bootstrap.servers": args.bootstrap})
    marks = cluster.watermarks(cluster.partitions([w.topic for w in workloads]))
    cluster.close()
    ranges = [(t, p, low, high) for (t, p), (low, high) in sorted(marks.items()) if high > low]
    options = {"bootstrap.servers": args.bootstrap}
    database = DatabaseSettings(name="probe", topic_pattern=prefix + r"\.(?P<schema>[^.]+)\.(?P<table>[^.]+)")
    reducers = TableReducers(database)

    def reduce_all(chunks_of) -> int:
        rows = 0
        for topic, partition, start, end in ranges:
            kafka_range = KafkaRange(topic, partition, start, end)
            for batch in reducers(kafka_range, topic.rsplit(".", 1)[1], lambda: iter(()),
                                  lambda r=(topic, partition, start, end): chunks_of(r)):
                rows += batch.num_rows
        return rows

    def reduce_joined(found) -> int:
        by_topic: dict[str, list[tuple[str, int, int, int]]] = {}
        for kafka_range in ranges:
            by_topic.setdefault(kafka_range[0], []).append(kafka_range)
        rows = 0
        for topic, group in by_topic.items():
            table = topic.rsplit(".", 1)[1]
            batches = reducers.joined(table, [(KafkaRange(*r), found[r]) for r in group])
            if batches is None:
                rows += sum(batch.num_rows for r in group for batch in reducers(
                    KafkaRange(*r), table, lambda: iter(()), functools.partial(iter, found[r])))
            else:
                rows += sum(batch.num_rows for batch in batches)
        return rows

    def reduce_task(found) -> int:
        tables = [(KafkaRange(*r), r[0].rsplit(".", 1)[1]) for r in ranges]
        return sum(batch.num_rows for batch in task_payloads(
            reducers, tables, found, lambda r: iter(()), lambda r: sys.exit("no large range in this probe")))

    print(f"{len(ranges)} ranges, {sum(r[3] - r[2] for r in ranges)} records; load {os.getloadavg()}")
    for name in ("per range", "one consumer", "per range + decode/reduce", "one consumer + decode/reduce",
                 "one consumer + joined decode/reduce", "one consumer + tables together"):
        started, cpu = time.perf_counter(), time.process_time()
        if name == "per range":
            count = sum(len(c.values) for r in ranges for c in read_values(options, *r))
        elif name == "one consumer":
            count = sum(len(c.values) for chunks in read_values_of_ranges(options, ranges).values() for c in chunks)
        elif name == "per range + decode/reduce":
            count = reduce_all(lambda r: read_values(options, *r))
        elif name == "one consumer + decode/reduce":
            found = read_values_of_ranges(options, ranges)
            count = reduce_all(lambda r: iter(found[r]))
        elif name == "one consumer + joined decode/reduce":
            count = reduce_joined(read_values_of_ranges(options, ranges))
        else:
            count = reduce_task(read_values_of_ranges(options, ranges))
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        print(f"{name:36s} {seconds:6.2f} s  {seconds / len(ranges) * 1000:5.1f} ms/range  "
              f"CPU {cpu:5.2f} s  ({count})")


if __name__ == "__main__":
    main()
