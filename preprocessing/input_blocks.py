"""Reading input files as *blocks*: about ``block_bytes`` of whole lines, line ends normalized.

A plain file is cut at byte offsets (each block ends just after a ``\\n``), so workers can read their
blocks themselves; a gzip file can only be read from the start, so its blocks come out of one
stream, cut after the last ``\\n`` of every ``block_bytes`` decompressed. Both cuts are
deterministic: every pass sees the same blocks, and the line counts of pass 0 stay valid.

Line ends: ``\\n``, ``\\r\\n`` and a lone ``\\r`` all end a line, as in Hadoop's line reader (which
the Spark engine uses), so both engines number lines alike.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
from typing import Iterator

from preprocessing.criteo_format import normalize_line_ends

DETECT_LINES = 101  # header + 100 data lines are checked by detect_format
_HEAD_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Block:
    """``length`` bytes at ``offset`` (plain file), or the ``index``-th block of a gzip stream."""

    file_index: int
    index: int
    offset: int
    length: int
    first_data_line: int = 0
    num_lines: int = 0


def open_input(path: str, compressed: bool):
    try:
        return gzip.open(path, "rb") if compressed else open(path, "rb")
    except OSError as error:
        raise OSError(f"Cannot open input {path}: {error}") from error


def check_compression(path: str, compressed: bool) -> None:
    """The ``.gz`` extension decides (as in Spark); a mismatch with the file's bytes is an error."""
    try:
        with open(path, "rb") as stream:
            magic = stream.read(2)
    except OSError as error:
        raise OSError(f"Cannot open input {path}: {error}") from error
    if compressed != (magic == b"\x1f\x8b"):
        state = "is named *.gz but is not gzip-compressed" if compressed else "is gzip-compressed but is not named *.gz"
        raise ValueError(f"{path} {state}; rename it so that the extension tells the compression")


def read_first_lines(path: str, compressed: bool, limit: int = DETECT_LINES) -> list[bytes]:
    """The first ``limit`` whole lines of a file, without terminators."""
    with open_input(path, compressed) as stream:
        try:
            head = stream.read(_HEAD_BYTES)
        except (OSError, EOFError) as error:
            raise OSError(f"{path}: cannot read ({'gzip' if compressed else 'plain'} file): {error}") from error
    if not head:
        return []
    truncated = len(head) == _HEAD_BYTES
    lines = normalize_line_ends(head).split(b"\n")
    if truncated or lines[-1] == b"":
        lines = lines[:-1]  # a partial last line, or the empty string after the final '\n'
    return lines[:limit]


def header_bytes(head: bytes) -> int:
    """Bytes of the first line including its terminator (``\\n``, ``\\r\\n`` or ``\\r``)."""
    ends = [i for i in (head.find(b"\n"), head.find(b"\r")) if i >= 0]
    if not ends:
        return len(head)
    end = min(ends)
    return end + 2 if head[end : end + 2] == b"\r\n" else end + 1


def plain_block_ranges(path: str, header: bool, block_bytes: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of about ``block_bytes`` each, ending just after a ``\\n`` (or at the end)."""
    size = os.path.getsize(path)
    ranges = []
    with open(path, "rb") as stream:
        start = header_bytes(stream.read(_HEAD_BYTES)) if header else 0
        while start < size:
            end = start + block_bytes
            if end < size:
                stream.seek(end)
                while True:
                    piece = stream.read(1 << 16)
                    if not piece:
                        end = size
                        break
                    newline = piece.find(b"\n")
                    if newline >= 0:
                        end += newline + 1
                        break
                    end += len(piece)
            end = min(end, size)
            ranges.append((start, end - start))
            start = end
    return ranges


def read_plain_block(path: str, offset: int, length: int) -> bytes:
    with open(path, "rb") as stream:
        stream.seek(offset)
        return normalize_line_ends(stream.read(length))


def iter_gzip_blocks(path: str, header: bool, block_bytes: int) -> Iterator[bytes]:
    """Normalized blocks of a gzip file, cut after the last ``\\n`` of every ``block_bytes`` read."""
    with open_input(path, True) as stream:
        carry = b""
        first = True
        while True:
            try:
                chunk = stream.read(block_bytes)
            except (OSError, EOFError) as error:
                raise OSError(f"{path}: corrupt gzip data: {error}") from error
            if first and header:
                chunk = chunk[header_bytes(chunk) :]
            first = False
            if not chunk:
                if carry:
                    yield normalize_line_ends(carry)
                return
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                carry = data
                continue
            carry = data[cut:]
            yield normalize_line_ends(data[:cut])


def count_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def plain_line_counts(path: str, ranges: list[tuple[int, int]]) -> list[int]:
    """Lines in each byte range of a plain file (pass 0, in a worker)."""
    return [count_lines(read_plain_block(path, offset, length)) for offset, length in ranges]


def gzip_line_counts(path: str, header: bool, block_bytes: int) -> list[int]:
    """Lines in each block of a gzip file (pass 0, in a worker)."""
    return [count_lines(data) for data in iter_gzip_blocks(path, header, block_bytes)]
