"""The read floor of a topic: its records read by the service's own range reader and nothing else.

One process per core (as many as the service's Spark tasks run at once), each reading its share of the
topic with `range_reader.read_values` (the reader the service's tasks use, values only): the partitions
dealt out in turn, or, where the topic has fewer partitions than processes, each partition cut into as many
pieces as there are processes (as the service cuts a one-partition topic's ranges). Nothing is decoded,
reduced or written, so no pipeline on this machine that reads the topic through this reader can be faster:
a matrix row whose floor is below a share of the best row's steady rate cannot reach that share.

Also the CPU the read costs per record: the readers' (their processes' CPU time, librdkafka's threads
included) and, with `--broker-pid`, the broker's (from /proc). On a machine that runs the broker next to
the service, that is CPU the rest of a pipeline (decode, reduce, MERGE) cannot have.

    .venv/bin/python bench/read_floor.py BOOTSTRAP TOPIC [--runs 3] [--processes N] [--broker-pid PID]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, in spawned readers too

from connectors.kafka.range_reader import read_values  # noqa: E402

Range = tuple[str, int, int, int]


def shares(bootstrap: str, topic: str, processes: int) -> list[list[Range]]:
    """Each reader process's ranges (topic, partition, start, end): the topic up to its high watermarks."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "read-floor"})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        ranges = [(topic, p, *consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30))
                  for p in partitions]
    finally:
        consumer.close()
    return dealt(ranges, processes)


def dealt(ranges: list[Range], processes: int) -> list[list[Range]]:
    """`ranges` dealt out to `processes` readers in turn; with fewer ranges than readers, each cut into
    `processes` pieces first."""
    if len(ranges) < processes:
        pieces = []
        for topic, partition, low, high in ranges:
            bounds = [low + (high - low) * i // processes for i in range(processes + 1)]
            pieces.extend((topic, partition, a, b) for a, b in zip(bounds, bounds[1:]) if b > a)
        ranges = pieces
    return [ranges[i::processes] for i in range(processes)]


def _read(bootstrap: str, ranges: list[Range], go, results) -> None:
    go.wait()  # every reader started, its imports done: the reads alone are timed
    started, cpu = time.time(), time.process_time()
    records = size = 0
    for topic, partition, start, end in ranges:
        for chunk in read_values({"bootstrap.servers": bootstrap}, topic, partition, start, end):
            records += len(chunk.values)
            size += sum(len(value) for value in chunk.values if value is not None)
    results.put((records, size, started, time.time(), time.process_time() - cpu))


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process `pid` has used so far, its threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_floor(bootstrap: str, topic: str, runs: int = 3, processes: int | None = None,
               broker_pid: int | None = None) -> dict:
    """Events/s and MB/s of values of `runs` whole reads of `topic` (the median run's, and every run's),
    with the readers' CPU-us per record (and the broker's, given its process id)."""
    processes = processes or os.cpu_count() or 2
    plan = shares(bootstrap, topic, processes)
    context = multiprocessing.get_context("spawn")  # no client threads of this process in the readers
    measured = []
    for _ in range(runs):
        shared = [share for share in plan if share]
        results, go = context.Queue(), context.Barrier(len(shared) + 1)
        readers = [context.Process(target=_read, args=(bootstrap, share, go, results)) for share in shared]
        for reader in readers:
            reader.start()
        broker_cpu = process_cpu_s(broker_pid) if broker_pid else None
        go.wait(timeout=600)
        done = [results.get(timeout=600) for _ in readers]
        if broker_cpu is not None:
            broker_cpu = process_cpu_s(broker_pid) - broker_cpu
        wall = max(d[3] for d in done) - min(d[2] for d in done)
        for reader in readers:
            reader.join()
        records, size = sum(d[0] for d in done), sum(d[1] for d in done)
        run = {"records": records, "rate": records / wall, "mb_s": size / wall / 1e6, "wall_s": wall,
               "reader_us": sum(d[4] for d in done) / records * 1e6 if records else None}
        if broker_cpu is not None and records:
            run["broker_us"] = broker_cpu / records * 1e6
        measured.append(run)
    median = sorted(measured, key=lambda run: run["rate"])[(len(measured) - 1) // 2]
    return {**median, "rates": [run["rate"] for run in measured], "processes": len(plan),
            "spread": statistics.pstdev(run["rate"] for run in measured) / median["rate"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--broker-pid", type=int, default=None, help="the broker's process, for its CPU")
    args = parser.parse_args()
    floor = read_floor(args.bootstrap, args.topic, args.runs, args.processes, args.broker_pid)
    print(f"{args.topic}: {floor['records']:,} records, {floor['processes']} readers: "
          f"{floor['rate']:,.0f} events/s, {floor['mb_s']:,.0f} MB/s "
          f"(runs: {', '.join(f'{rate:,.0f}' for rate in floor['rates'])}); CPU per record: "
          f"readers {floor['reader_us']:.1f} us" + (f", broker {floor['broker_us']:.1f} us" if "broker_us" in floor else ""))


if __name__ == "__main__":
    main()
