"""A real PNG built with zlib, so the round trip copies binary data with NULs, CRs and LFs."""

from __future__ import annotations

import struct
import zlib


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def make_png(width: int = 96, height: int = 64) -> bytes:
    """An RGB gradient with a noisy band: valid PNG, not trivially compressible."""
    rows = bytearray()
    seed = 12345
    for y in range(height):
        rows.append(0)  # filter type: none
        for x in range(width):
            seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
            noise = seed >> 23 if 20 <= y < 30 else 0
            rows += bytes(((x * 255 // width) ^ noise, (y * 255 // height) & 0xFF, (x * y) & 0xFF))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(bytes(rows), 9))
        + _chunk(b"IEND", b"")
    )
