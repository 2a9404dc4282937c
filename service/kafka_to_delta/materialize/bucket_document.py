"""One key bucket's materializer state as one stored value, read and rewritten per micro-batch.

The document holds, for every primary key of the bucket, the rules' state text and the event time
the key was last touched at (`StoredState`). It is stored as Arrow columns (key, state, touched) in
an IPC stream with zstd-compressed buffers, behind the marker byte `\\x02`. A micro-batch touches a
tenth of a bucket's keys or less, and only those keys cross into Python objects: their states are
looked up with a hash join of the touched keys against the key column (`take`), and the new document
is the old one without them plus their new states (`replace`), a copy of columns. As one JSON
document the whole bucket was parsed into a dict and serialised again at every call: a bucket of
6,250 keys, 600 of them touched, costs 3.1-3.3 ms per call this way against 5.2-5.4 ms
(`bench/bucket_call_costs.py`), and the Python work no longer grows with the bucket.

Documents written before are read too: zstd-compressed JSON (marker `\\x01`, then its length in 8
bytes) and plain JSON; the next write turns them into columns. Earlier code cannot read the columns:
a downgrade past this layout needs `rebuild-state`.
"""

from __future__ import annotations

from typing import Collection, Iterable

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from service.kafka_to_delta.barrier import outlived_mask

StoredState = tuple[str, "int | None"]
"""(the rules' state text, the event time the key was last touched at; None without a TTL)."""

_COLUMNS = pa.schema([("key", pa.string()), ("state", pa.string()), ("touched", pa.int64())])
_ARROW = b"\x02"
_ZSTD_JSON = b"\x01"
_JSON_CODEC = pa.Codec("zstd", compression_level=1)
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=1))


class BucketDocument:
    """The stored keys of one bucket (mutable: `replace` and `expire` change it in place)."""

    def __init__(self, table: pa.Table | None = None) -> None:
        self.table = _COLUMNS.empty_table() if table is None else table

    @classmethod
    def read(cls, blob: bytes | None) -> "BucketDocument":
        """The document of a stored value (None or empty: an empty bucket), in any layout written so far."""
        if not blob:
            return cls()
        if blob[:1] == _ARROW:
            return cls(pa.ipc.open_stream(pa.py_buffer(blob).slice(1)).read_all())
        if blob[:1] == _ZSTD_JSON:
            blob = _JSON_CODEC.decompress(blob[9:], int.from_bytes(blob[1:9], "little"), asbytes=True)
        return cls.of_states({key: (text, touched) for key, (text, touched) in orjson.loads(blob).items()})

    @classmethod
    def of_states(cls, states: dict[str, StoredState]) -> "BucketDocument":
        """A document holding exactly `states`."""
        return cls(_table(states))

    def __len__(self) -> int:
        return self.table.num_rows

    def states(self) -> dict[str, StoredState]:
        """Every key's stored state (the whole bucket as Python objects)."""
        columns = (self.table.column(name).to_pylist() for name in _COLUMNS.names)
        return {key: (state, touched) for key, state, touched in zip(*columns)}

    def take(self, keys: Iterable[str]) -> dict[str, StoredState]:
        """The stored states of those of `keys` the bucket holds."""
        # The bucket's keys are probed against a hash of the few wanted ones: hashing the bucket's keys
        # instead (`index_in` with the bucket as its value set) costs per stored key on every call.
        wanted = pa.array(list(keys), pa.string())
        found = self.table.filter(pc.is_in(self.table.column("key"), value_set=wanted))
        columns = (found.column(name).to_pylist() for name in _COLUMNS.names)
        return {key: (state, touched) for key, state, touched in zip(*columns)}

    def replace(self, keys: Collection[str], states: dict[str, StoredState]) -> None:
        """Drop `keys`, then hold `states` (the new states of those of `keys` that are kept)."""
        kept = self.table
        if keys:
            kept = kept.filter(pc.invert(pc.is_in(kept.column("key"), value_set=pa.array(list(keys), pa.string()))))
        self.table = pa.concat_tables([kept, _table(states)]) if states else kept  # `to_bytes` combines

    def expire(self, ttl_ms: int, watermark_ms: int) -> int:
        """Drop the keys the watermark left behind by at least the TTL; how many were dropped."""
        if not ttl_ms or not len(self):
            return 0
        alive = pc.invert(outlived_mask(self.table.column("touched"), ttl_ms, watermark_ms))
        before = len(self)
        self.table = self.table.filter(alive)
        return before - len(self)

    def next_expiry(self, ttl_ms: int) -> int | None:
        """The event time at which the first key outlives the TTL (None: never)."""
        if not ttl_ms:
            return None
        earliest = pc.min(self.table.column("touched")).as_py()
        return None if earliest is None else earliest + ttl_ms

    def to_bytes(self) -> bytes:
        """The stored value (`read` reads it back)."""
        sink = pa.BufferOutputStream()
        sink.write(_ARROW)
        with pa.ipc.new_stream(sink, _COLUMNS, options=_WRITE_OPTIONS) as writer:
            writer.write_table(self.table.combine_chunks())
        return sink.getvalue().to_pybytes()


def _table(states: dict[str, StoredState]) -> pa.Table:
    values = list(states.values())
    return pa.table([pa.array(list(states), pa.string()), pa.array([v[0] for v in values], pa.string()),
                     pa.array([v[1] for v in values], pa.int64())], schema=_COLUMNS)


def encode_bucket(states: dict[str, StoredState]) -> bytes:
    """One bucket's state, every key given, as its stored value."""
    return BucketDocument.of_states(states).to_bytes()


def decode_bucket(blob: bytes | None) -> dict[str, StoredState]:
    """Every key's state of a stored value (None: an empty bucket)."""
    return BucketDocument.read(blob).states()
