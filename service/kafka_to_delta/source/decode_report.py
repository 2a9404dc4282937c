"""How the bucket stage's decode tasks decoded their Kafka ranges, reported to the driver.

The plain path's ranges say how they were decoded in their payloads (`vectorised`, `fallback`,
`odd_records`). The bucket stage's decode tasks hand their rows to the bucket stage, not to the driver,
so they add to a Spark accumulator instead (`DecodeWays`), which the driver reads once per micro-batch;
the counts then go where the plain path's go (`BatchChanges`: the `cdc_ranges` and `cdc_odd_records`
metrics, the log line naming why a range went record by record). Only ranges the bulk way could take are
counted (Avro under the plain path's settings, `changelog_columns`): JSON goes record by record there by
design.
"""

from __future__ import annotations

from pyspark import SparkContext
from pyspark.accumulators import Accumulator, AccumulatorParam

from service.kafka_to_delta.source.changelog_columns import RangeChangelog

COUNTS = ("vectorised", "record_by_record", "odd_records")
REASONS_KEPT = 5
"""Why ranges went record by record: at most this many reasons a micro-batch."""


class _Ways(AccumulatorParam):
    """Accumulates `{count name: sum, "fallbacks": [reason, ...]}`."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, value1: dict, value2: dict) -> dict:
        for name in COUNTS:
            value1[name] = value1.get(name, 0) + value2.get(name, 0)
        value1["fallbacks"] = (value1.get("fallbacks", []) + value2.get("fallbacks", []))[:REASONS_KEPT]
        return value1


class DecodeWays:
    """The accumulator the decode tasks report each range to (`report`), read by the driver (`take`)."""

    def __init__(self, context: SparkContext) -> None:
        self.accumulator: Accumulator = context.accumulator({}, _Ways())

    def report(self, decoded: RangeChangelog) -> None:
        """Executor side: how one range was decoded (nothing when the bulk way could not take it)."""
        if not decoded.applies:
            return
        gave_up = decoded.fallback is not None
        self.accumulator.add({"vectorised": int(not gave_up), "record_by_record": int(gave_up),
                              "odd_records": decoded.odd, "fallbacks": [decoded.fallback] if gave_up else []})

    def take(self) -> dict:
        """Driver side: what the finished micro-batch's tasks reported (call after its action); starts over."""
        reported = dict(self.accumulator.value)
        self.accumulator.value = {}
        return reported

    def __getstate__(self) -> dict:
        return {"accumulator": self.accumulator}
