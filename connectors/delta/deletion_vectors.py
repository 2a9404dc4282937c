"""Delta deletion vectors: the rows of a data file a commit marks deleted, read and written as the
Delta protocol lays them out (PROTOCOL.md, "Deletion Vectors").

A deletion vector is a set of row positions of one data file, serialised as a `RoaringBitmapArray`
(magic 1681511377 little-endian, the number of 32-bit bitmaps as a little-endian int64, then per
bitmap its key, the high 32 bits, little-endian, and the bitmap in the portable Roaring format,
`pyroaring`'s). Its descriptor (the `deletionVector` of an `add` action) says where it is:
- `u`: in a file `deletion_vector_<uuid>.bin` of the table's root (or of a folder named by a prefix),
  `pathOrInlineDv` being the prefix and the UUID in Z85; `offset` is where its entry starts in that
  file, which begins with a version byte (1) and holds entries of a big-endian int32 size, the data
  and the data's big-endian CRC-32;
- `i`: inline, `pathOrInlineDv` the data in Z85;
- `p`: an absolute path.
This module writes `u` files, one per commit holding every vector that commit adds.
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

import numpy as np
from pyroaring import BitMap

__all__ = ["DeletionVectorError", "Descriptor", "positions", "vector_file", "write_vectors", "z85_decode",
           "z85_encode"]

MAGIC = 1681511377
_VERSION = 1
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}


class DeletionVectorError(ValueError):
    """A deletion vector that cannot be read as the protocol describes it."""


def z85_encode(data: bytes) -> str:
    """ZeroMQ's Z85 of `data` (its length a multiple of 4)."""
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte words")
    out: list[str] = []
    for (word,) in struct.iter_unpack(">I", data):
        chars = []
        for _ in range(5):
            word, digit = divmod(word, 85)
            chars.append(_Z85[digit])
        out.extend(reversed(chars))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    """The bytes of Z85 `text` (its length a multiple of 5)."""
    if len(text) % 5:
        raise DeletionVectorError(f"Z85 text of {len(text)} characters (not a multiple of 5)")
    out = bytearray()
    for start in range(0, len(text), 5):
        word = 0
        for char in text[start:start + 5]:
            value = _Z85_VALUE.get(char)
            if value is None:
                raise DeletionVectorError(f"{char!r} is not a Z85 character")
            word = word * 85 + value
        if word >= 1 << 32:
            raise DeletionVectorError("Z85 word out of range")
        out += struct.pack(">I", word)
    return bytes(out)


@dataclass(frozen=True)
class Descriptor:
    """The `deletionVector` field of an add or remove action."""

    storage_type: str
    path_or_inline: str
    size: int
    cardinality: int
    offset: int | None = None

    @classmethod
    def of(cls, action: dict | None) -> Descriptor | None:
        """From an action's `deletionVector` (None: the file has none)."""
        if not action:
            return None
        return cls(action["storageType"], action["pathOrInlineDv"], int(action["sizeInBytes"]),
                   int(action["cardinality"]), None if action.get("offset") is None else int(action["offset"]))

    def action(self) -> dict:
        """As the log writes it."""
        out: dict = {"storageType": self.storage_type, "pathOrInlineDv": self.path_or_inline,
                     "sizeInBytes": self.size, "cardinality": self.cardinality}
        if self.offset is not None:
            out["offset"] = self.offset
        return out


def _serialised(rows: np.ndarray) -> bytes:
    """A `RoaringBitmapArray` of sorted, distinct row positions."""
    highs = (rows >> 32).astype(np.int64)
    parts = [struct.pack("<iq", MAGIC, 0)]
    count = 0
    for high in np.unique(highs).tolist():
        low = (rows[highs == high] & 0xFFFFFFFF).astype(np.uint32)
        parts.append(struct.pack("<i", high) + BitMap(low.tolist()).serialize())
        count += 1
    parts[0] = struct.pack("<iq", MAGIC, count)
    return b"".join(parts)


def _parsed(data: bytes, where: str) -> np.ndarray:
    if len(data) < 12:
        raise DeletionVectorError(f"deletion vector {where}: {len(data)} bytes")
    magic, count = struct.unpack_from("<iq", data)
    if magic != MAGIC:
        raise DeletionVectorError(f"deletion vector {where}: magic {magic}, not {MAGIC}")
    parts, at = [], 12
    for _ in range(count):
        (high,) = struct.unpack_from("<i", data, at)
        bitmap = BitMap.deserialize(data[at + 4:])
        size = len(bitmap.serialize())
        parts.append(np.asarray(bitmap.to_array(), np.int64) + (high << 32))
        at += 4 + size
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def vector_file(root: str, descriptor: Descriptor) -> str | None:
    """The path of the file holding `descriptor`'s vector (None: it is inline)."""
    return None if descriptor.storage_type == "i" else _file_of(root, descriptor)


def _file_of(root: str, descriptor: Descriptor) -> str:
    if descriptor.storage_type == "p":
        parsed = urlparse(descriptor.path_or_inline)
        return unquote(parsed.path) if parsed.scheme in ("file", "") else descriptor.path_or_inline
    text = descriptor.path_or_inline
    prefix, encoded = text[:-20], text[-20:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return os.path.join(root, prefix, name) if prefix else os.path.join(root, name)


def positions(root: str, descriptor: Descriptor | None) -> np.ndarray:
    """The row positions `descriptor` marks deleted (sorted int64; empty for None), its file read from
    table root `root` (a local path)."""
    if descriptor is None:
        return np.empty(0, np.int64)
    if descriptor.storage_type == "i":
        return _parsed(z85_decode(descriptor.path_or_inline)[:descriptor.size], "inline")
    if descriptor.storage_type not in ("u", "p"):
        raise DeletionVectorError(f"deletion vector storage type {descriptor.storage_type!r} unknown")
    path = _file_of(root, descriptor)
    with open(path, "rb") as source:
        source.seek(descriptor.offset or 0)
        head = source.read(4)
        if len(head) < 4:
            raise DeletionVectorError(f"deletion vector {path}@{descriptor.offset}: cut short")
        (size,) = struct.unpack(">i", head)
        data = source.read(size)
        stored = source.read(4)
    if size != descriptor.size or len(data) != size or len(stored) < 4:
        raise DeletionVectorError(f"deletion vector {path}@{descriptor.offset}: {size} bytes, "
                                  f"the log says {descriptor.size}")
    if zlib.crc32(data) != struct.unpack(">I", stored)[0]:
        raise DeletionVectorError(f"deletion vector {path}@{descriptor.offset}: checksum mismatch")
    return _parsed(data, f"{path}@{descriptor.offset}")


def write_vectors(root: str, vectors: list[np.ndarray]) -> tuple[str, list[Descriptor]]:
    """Write `vectors` (each the sorted, distinct deleted positions of one file) to one new file under
    `root`; (its name, one descriptor per vector)."""
    identity = uuid.uuid4()
    name = f"deletion_vector_{identity}.bin"
    encoded = z85_encode(identity.bytes)
    body, descriptors = bytearray([_VERSION]), []
    for rows in vectors:
        data = _serialised(rows)
        descriptors.append(Descriptor("u", encoded, len(data), int(len(rows)), len(body)))
        body += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    with open(os.path.join(root, name), "wb") as out:
        out.write(body)
    return name, descriptors
