"""`ChangelogBatchDecoder.chunk` (a range read as value chunks that keep their records) gives exactly the rows
`ChangelogBatchDecoder` gives for the same records as the Kafka record batch `read_range` makes of them
(`ValueChunk.records`): the fuzz inputs (every format, every
bad-record policy, with and without the raw bytes kept on every row), null timestamps and a chunk joining two
partitions included.

Seeds: fixed plus one random (`FUZZ_SEED=<n>` replays one); failures name the seed."""

from __future__ import annotations

import os
from collections import defaultdict

import pyarrow as pa
import pytest

from connectors.kafka.range_reader import ValueChunk, joined_chunk
from service.config.from_changelog import FromChangelogSettings
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from testbed.fuzz_records import FORMATS, POLICIES, decoders, generate, raw_batch
from tests.support.run_seed import run_seed
from tests.support.value_chunks import chunk_of

SEEDS = (3, 71, int(os.environ.get("FUZZ_SEED", run_seed(1_000_000))))
RECORDS = 2_000


def _batches(seed: int) -> tuple[object, dict[str, list[pa.RecordBatch]]]:
    fuzz = generate(seed, RECORDS)
    grouped: dict[tuple[str, int], list] = defaultdict(list)
    for record in fuzz.records:
        grouped[(record.topic, record.partition)].append(record)
    out: dict[str, list[pa.RecordBatch]] = defaultdict(list)
    for (topic, _), records in sorted(grouped.items()):
        batch = raw_batch(records)
        stamps = batch.column("timestamp").to_pylist()
        stamps[::7] = [None] * len(stamps[::7])  # records without a timestamp
        out[topic].append(batch.set_column(5, "timestamp", pa.array(stamps, batch.schema.field("timestamp").type)))
    return fuzz, out


@pytest.mark.parametrize("seed", SEEDS, ids=lambda seed: f"seed={seed}")
@pytest.mark.parametrize("policy", POLICIES)
def test_a_chunk_decodes_as_its_record_batch(seed: int, policy: str) -> None:
    fuzz, batches = _batches(seed)
    decoder_of = decoders(policy, fuzz.registry)  # type: ignore[arg-type]
    errors = 0
    for topic, partitions in batches.items():
        for batch in partitions:
            chunk = chunk_of(batch)
            expected = decoder_of[topic](chunk.records())
            got = decoder_of[topic].chunk(chunk)
            assert got.equals(expected), f"seed {seed}: {topic} partition {batch.column('partition')[0]}"
            errors += expected.column("error").null_count < expected.num_rows
    assert errors, f"seed {seed}: no batch held a bad record: the raw bytes were not compared"


@pytest.mark.parametrize("seed", SEEDS, ids=lambda seed: f"seed={seed}")
def test_rows_keeping_their_raw_bytes_and_a_joined_chunk(seed: int) -> None:
    fuzz, batches = _batches(seed)
    fmt = FORMATS["debezium"]
    settings = FromChangelogSettings(**{**fmt.config("DEAD_LETTER"), "late_handling": "dead_letter"})
    decoder = ChangelogBatchDecoder(settings, ("id",))
    parts = batches[fmt.topic][:2]
    for batch in parts:  # every row keeps its record's key, value and headers
        chunk = chunk_of(batch)
        expected = decoder(chunk.records())
        assert expected.column("raw_value").null_count == 0
        assert decoder.chunk(chunk).equals(expected), f"seed {seed}"
    joined: ValueChunk = joined_chunk([chunk_of(batch) for batch in parts])
    joined.messages = [m for batch in parts for m in chunk_of(batch).messages or ()]
    got = decoder.chunk(joined)
    records = pa.Table.from_batches([chunk_of(batch).records() for batch in parts]).combine_chunks().to_batches()[0]
    expected = decoder(records)
    assert got.equals(expected), f"seed {seed}: a chunk joining two partitions"
