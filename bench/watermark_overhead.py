"""Cost of the per-partition watermark candidates next to decoding, per 20,000-record Kafka batch."""
import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
import pyarrow as pa

from connectors.kafka.range_reader import SOURCE_SCHEMA
from service.config.settings import PipelineSettings
from service.kafka_to_delta.source.decode_stage import batch_decoder
from service.kafka_to_delta.source.event_time_progress import PartitionWatermark
from service.operations.workload import DebeziumWorkload

w = DebeziumWorkload("t", 1, "always", seed=1, with_timestamp=True)
events = w.generate(20_000, 5_000)[:20_000]
n = len(events)
batch = pa.RecordBatch.from_pydict({
    "key": [e.key for e in events], "value": [e.value for e in events], "topic": ["t"] * n,
    "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(range(n), pa.int64()),
    "timestamp": pa.array([1_700_000_000_000_000 + i * 1000 for i in range(n)], pa.timestamp("us", tz="UTC")),
    "headers": pa.nulls(n, SOURCE_SCHEMA.field("headers").type), "watermark_floor": pa.array([10**12] * n, pa.int64()),
}, schema=SOURCE_SCHEMA)
decoder = batch_decoder(PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"]))
decoded = decoder(batch)
for label, fn in (("decode", lambda: decoder(batch)), ("watermark candidates", lambda: PartitionWatermark().candidates(batch, decoded))):
    times = []
    for _ in range(5):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    print(f"{label}: {min(times)*1000:.1f} ms per {n} records (best of 5)")
