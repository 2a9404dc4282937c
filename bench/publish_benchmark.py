"""What publishing an export batch costs the driver's Python: `TransactionalProducer.send_batch` alone.

Publishes `--batches` transactions of `--records` records (values of `--value-bytes`, JSON-like keys,
the export's two headers shared per batch, as the encoders give them) to a new topic of a running
broker, and prints per batch the wall time and the calling thread's CPU time (what the export's
encoding competes with for the GIL), then the medians per record. The first batch (the producer's
start, `init_transactions`) is left out of the medians.

    .venv/bin/python bench/publish_benchmark.py --bootstrap $(cut -d' ' -f1 /tmp/devbroker.addr)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid

from connectors.kafka.transactional_producer import PositionRecord, TransactionalProducer


def records(count: int, value_bytes: int, batch: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """`count` distinct records of one batch, sharing one headers list as the encoders do."""
    headers = [("cdc.table", b"bench_customers"), ("cdc.commit_version", str(batch).encode())]
    pad = os.urandom(value_bytes // 2).hex().encode()[:value_bytes]
    return [(b'{"id":%d}' % i, b'{"id":%d,' % i + pad, headers) for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--bootstrap", required=True, help="a running broker")
    parser.add_argument("--records", type=int, default=100_000, help="records per transaction")
    parser.add_argument("--value-bytes", type=int, default=1_000, help="bytes per value")
    parser.add_argument("--batches", type=int, default=6, help="transactions (the first is left out)")
    args = parser.parse_args()
    run = uuid.uuid4().hex[:8]
    producer = TransactionalProducer({"bootstrap.servers": args.bootstrap}, f"bench-publish-{run}",
                                     f"bench.publish.{run}", f"bench.publish-positions.{run}")
    walls, cpus = [], []
    for batch in range(args.batches):
        batch_records = records(args.records, args.value_bytes, batch)
        started, cpu = time.perf_counter(), time.thread_time()
        producer.send_batch(batch_records, PositionRecord(run, str(batch).encode()))
        wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
        print(f"batch {batch}: {args.records:,} records in {wall:.2f} s, publishing thread CPU {cpu:.2f} s")
        if batch:
            walls.append(wall)
            cpus.append(cpu)
    per = 1e6 / args.records
    print(f"median per record: wall {statistics.median(walls) * per:.2f} us, "
          f"publishing thread CPU {statistics.median(cpus) * per:.2f} us")


if __name__ == "__main__":
    main()
