"""Vectorised decoding of many text fields at once: decimal integers and 8-digit hex hashes.

A field is given by the position just after its last byte (``end``) and its ``length`` in a block of
bytes. The fast paths load the 8 bytes ending at ``end`` as one little-endian uint64 (an unaligned
strided view, no copy) and decode all 8 characters with a handful of whole-word operations
("SIMD within a register"): one numpy operation handles every field of the block.

- hex: 8 characters ``[0-9a-fA-F]``: a per-byte range check, then nibbles packed into 32 bits;
- decimal: up to 8 characters ``-?[0-9]+``: the field is left-padded with ``'0'`` to 8 digits and
  combined pairwise (10, 100, 10000), the classic 8-digit parse;
- everything else (longer numbers, integral floats ``260.0``, anything invalid) goes to a general
  per-character path over only those fields, which has the final say on validity.
"""

from __future__ import annotations

import numpy as np

HASH_CHARS = 8
MAX_INTEGER_CHARS = 18  # int64 holds every 18-digit number

_ONES = np.uint64(0x0101010101010101)
_HIGH = np.uint64(0x8080808080808080)
_ZEROS = np.uint64(0x3030303030303030)
_POWERS_OF_TEN = np.array([10**k for k in range(MAX_INTEGER_CHARS + 1)], dtype=np.int64)


def words_ending_at(data: bytes) -> np.ndarray:
    """``W`` with ``W[i]`` = the 8 bytes ``data[i-8:i]`` as a little-endian uint64 (zeros before 0)."""
    padded = b"\0" * 8 + data
    return np.ndarray(shape=(len(data) + 1,), dtype="<u8", buffer=padded, offset=0, strides=(1,))


def _bytes_in_range(words: np.ndarray, low: int, high: int) -> np.ndarray:
    """Per byte (all < 0x80): the byte's high bit set iff ``low <= byte <= high``."""
    at_least_low = words + np.uint64((0x80 - low) * 0x0101010101010101)
    above_high = words + np.uint64((0x7F - high) * 0x0101010101010101)
    return at_least_low & ~above_high & _HIGH


def decode_hashes(words: np.ndarray, ends: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fields that must be empty or 8 hex digits -> ``(int64 value, -1 if empty; ok)``."""
    x = words[ends]
    ascii_only = (x & _HIGH) == 0
    letters = _bytes_in_range(x | np.uint64(0x2020202020202020), 0x61, 0x66)
    digits = _bytes_in_range(x, 0x30, 0x39)
    ok = (lengths == 0) | ((lengths == HASH_CHARS) & ascii_only & ((letters | digits) == _HIGH))
    nibbles = (x & np.uint64(0x0F0F0F0F0F0F0F0F)) + np.uint64(9) * ((x >> np.uint64(6)) & _ONES)
    pairs = ((nibbles << np.uint64(4)) | (nibbles >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    byte = np.uint64(0xFF)
    value = (
        ((pairs & byte) << np.uint64(24))
        | (((pairs >> np.uint64(16)) & byte) << np.uint64(16))
        | (((pairs >> np.uint64(32)) & byte) << np.uint64(8))
        | (pairs >> np.uint64(48))
    ).astype(np.int64)
    value[lengths == 0] = -1
    return value, ok


def decode_integers(
    words: np.ndarray, raw: np.ndarray, ends: np.ndarray, lengths: np.ndarray, has_dot: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decimal fields -> ``(int64 magnitude, negative, ok)``; an empty field is 0 and ok."""
    x = words[ends]
    pad_bits = (np.uint64(8) - np.minimum(lengths, 8).astype(np.uint64)) * np.uint64(8)
    field_mask = np.left_shift(np.uint64(0xFFFFFFFFFFFFFFFF), pad_bits)  # 0 for an empty field
    x = (x & field_mask) | (_ZEROS & ~field_mask)
    first = (x >> pad_bits) & np.uint64(0xFF)
    negative = (first == ord("-")) & (lengths >= 2)
    x ^= np.where(negative, np.left_shift(np.uint64(ord("-") ^ ord("0")), pad_bits), np.uint64(0))
    fast = (lengths <= 8) & ((x & _HIGH) == 0) & (_bytes_in_range(x, 0x30, 0x39) == _HIGH)
    d = x - _ZEROS
    d = (d * np.uint64(10) + (d >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    d = (d * np.uint64(100) + (d >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    d = (d * np.uint64(10000) + (d >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
    value = d.astype(np.int64)
    ok = fast.copy()
    slow = np.flatnonzero(~fast)
    if slow.size:
        slow_value, slow_negative, slow_ok = _decode_integers_general(raw, ends.ravel()[slow], lengths.ravel()[slow], has_dot)
        value.ravel()[slow] = slow_value
        negative.ravel()[slow] = slow_negative
        ok.ravel()[slow] = slow_ok
    return value, negative, ok


def _decode_integers_general(
    raw: np.ndarray, ends: np.ndarray, lengths: np.ndarray, has_dot: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-character parsing of ``-?[0-9]+`` with an optional ``.0*`` fraction, fields right-aligned.

    Each field's last ``width`` bytes are gathered into ``[fields, width]``; position ``p`` holds a
    character of the field when ``p >= width - length``. An integral float keeps its digits after
    the dot, which must all be ``0``: the magnitude is then divided by ``10**(digits after dot)``.
    """
    width = int(min(max(lengths.max(initial=0), 1), MAX_INTEGER_CHARS))
    padded = np.concatenate([np.zeros(width, dtype=np.uint8), raw])
    chars = np.lib.stride_tricks.as_strided(padded, shape=(raw.shape[0] + 1, width), strides=(1, 1))[ends]
    position = np.arange(width, dtype=np.int64)
    first = width - np.minimum(lengths, width)
    inside = position >= first[:, None]
    digits = chars - np.uint8(ord("0"))
    is_digit = digits < 10
    minus = (chars == ord("-")) & (position == first[:, None]) & (lengths[:, None] >= 2)
    negative = minus.any(axis=-1)
    accepted = is_digit | minus | ~inside
    dot_at = np.full(lengths.shape, width)
    ok = lengths <= MAX_INTEGER_CHARS
    if has_dot:
        dot = inside & (chars == ord("."))
        dots = dot.sum(axis=-1)
        dot_at = np.where(dots == 1, np.argmax(dot, axis=-1), width)
        after_dot = inside & (position > dot_at[:, None])
        accepted = (accepted | dot) & ~(after_dot & (chars != ord("0")))
        ok &= (dots <= 1) & ((dots == 0) | (dot_at - first - negative >= 1))  # a digit before the dot
    ok &= accepted.all(axis=-1)
    digits = np.where(inside & is_digit, digits, 0).astype(np.int64)
    value = np.zeros(lengths.shape, dtype=np.int64)
    for index in range(width):
        value = value * 10 + digits[:, index]
    value //= _POWERS_OF_TEN[width - dot_at]
    return value, negative, ok
