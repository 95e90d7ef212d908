"""Read the pixels of a PNG (8-bit RGB or RGBA, not interlaced: what Chromium writes)."""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Image:
    """Decoded pixels: ``image[x, y]`` is ``(r, g, b)``."""

    def __init__(self, width: int, height: int, channels: int, rows: list[bytes]) -> None:
        self.width = width
        self.height = height
        self._channels = channels
        self._rows = rows

    def __getitem__(self, xy: tuple[int, int]) -> tuple[int, int, int]:
        x, y = xy
        i = x * self._channels
        row = self._rows[y]
        return row[i], row[i + 1], row[i + 2]


def read_png(path: Path) -> Image:
    """Decode a PNG file written by Chromium."""
    data = path.read_bytes()
    assert data.startswith(_SIGNATURE), f"{path} is not a PNG"
    pos, idat, header = len(_SIGNATURE), b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8, f"{path}: {depth}-bit samples"
    assert colour in {2, 6}, f"{path}: colour type {colour}"
    assert interlace == 0, f"{path}: interlaced"
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                guess = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + guess) & 0xFF
        rows.append(bytes(line))
        previous = line
    return Image(width, height, channels, rows)
