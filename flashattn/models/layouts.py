"""Where the elements of a tile live in shared memory: row-major, padded, doubled, transposed, XOR-swizzled.

A :class:`TileLayout` maps each logical element ``(row, col)`` of a tile to a byte address. Which bank
that address falls in, and what a warp's request costs, is the bank model's business
(``flashattn.banks``); this module only places the elements. Padding is counted in 4-byte words, the
width of one bank, because a row that starts one word later starts one bank later.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from flashattn.kernels.v2 import compute_padded_headdim

WORD_BYTES = 4  # a shared-memory bank serves one 4-byte word per wavefront
CHUNK_BYTES = 16  # the unit an XOR swizzle permutes (one 128-bit vector)


def check_int(value, name: str, *, minimum: int | None = 0) -> int:
    """``value`` as an int (TypeError for a bool, float or other type; ValueError below ``minimum``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class TileLayout:
    """Where each element of a logical ``rows × cols`` tile lives in shared memory.

    The tile is stored as *lines* (rows when ``order == "row"``, columns when ``order == "col"``),
    ``line_stride`` elements apart (``>=`` the line length: the rest is padding). With
    ``swizzle_period > 1`` the 16-byte chunks of line ``L`` are permuted: chunk ``j`` is stored at
    chunk ``j XOR ((L // swizzle_per_phase) % swizzle_period)`` of that line.
    """

    rows: int
    cols: int
    element_bytes: int = 4
    order: str = "row"
    line_stride: int | None = None  # elements; default: no padding
    swizzle_period: int = 1
    swizzle_per_phase: int = 1
    name: str = ""

    def __post_init__(self):
        for field_name in ("rows", "cols", "element_bytes", "swizzle_period", "swizzle_per_phase"):
            check_int(getattr(self, field_name), field_name, minimum=1)
        if self.element_bytes not in (1, 2, 4, 8):
            raise ValueError(f"element_bytes must be 1, 2, 4 or 8, got {self.element_bytes}")
        if self.order not in ("row", "col"):
            raise ValueError(f"order must be 'row' (row-major) or 'col' (column-major), got {self.order!r}")
        stride = self.line_length if self.line_stride is None else check_int(self.line_stride, "line_stride")
        if stride < self.line_length:
            raise ValueError(f"line_stride ({stride} elements) is shorter than a line ({self.line_length} elements)")
        object.__setattr__(self, "line_stride", stride)
        p = self.swizzle_period
        if p > 1:
            if p & (p - 1):
                raise ValueError(f"swizzle_period must be a power of two, got {p}")
            chunks = self.line_length * self.element_bytes / CHUNK_BYTES
            if chunks != int(chunks) or int(chunks) % p:
                raise ValueError(f"an XOR swizzle over {p} rows needs lines of a multiple of {p} 16-byte chunks; "
                                 f"a line of {self.line_length} × {self.element_bytes} bytes is {chunks:g} chunks")
        if not self.name:
            object.__setattr__(self, "name", self.describe())

    @property
    def line_length(self) -> int:
        return self.cols if self.order == "row" else self.rows

    @property
    def lines(self) -> int:
        return self.rows if self.order == "row" else self.cols

    @property
    def padding(self) -> int:
        """Padding elements at the end of each line."""
        return self.line_stride - self.line_length

    @property
    def size_bytes(self) -> int:
        return self.lines * self.line_stride * self.element_bytes

    def describe(self) -> str:
        kind = "row-major" if self.order == "row" else "column-major (transposed)"
        text = f"{self.rows}×{self.cols} {kind}, {self.element_bytes}-byte elements"
        if self.padding:
            words = self.padding * self.element_bytes / WORD_BYTES
            text += f", line stride {self.line_stride} (+{words:g} word{'' if words == 1 else 's'})"
        if self.swizzle_period > 1:
            per = f"(line // {self.swizzle_per_phase})" if self.swizzle_per_phase > 1 else "line"
            text += f", 16-byte chunks XOR ({per} mod {self.swizzle_period})"
        return text

    def byte_address(self, row: int, col: int) -> int:
        """Byte offset of logical element ``(row, col)`` from the start of the tile."""
        if not (0 <= row < self.rows and 0 <= col < self.cols):
            raise ValueError(f"element ({row}, {col}) is outside the {self.rows}×{self.cols} tile")
        line, pos = (row, col) if self.order == "row" else (col, row)
        offset = pos * self.element_bytes
        if self.swizzle_period > 1:
            chunk = offset // CHUNK_BYTES ^ (line // self.swizzle_per_phase) % self.swizzle_period
            offset = chunk * CHUNK_BYTES + offset % CHUNK_BYTES
        return (line * self.line_stride) * self.element_bytes + offset


def pad_elements(pad_words: int, element_bytes: int) -> int:
    """``pad_words`` 4-byte words as a number of elements (ValueError if not a whole number)."""
    pad_words = check_int(pad_words, "pad_words")
    if (pad_words * WORD_BYTES) % element_bytes:
        raise ValueError(f"+{pad_words} words is not a whole number of {element_bytes}-byte elements")
    return pad_words * WORD_BYTES // element_bytes


def row_major(rows: int, cols: int, element_bytes: int = 4, pad_words: int = 0) -> TileLayout:
    """A ``rows × cols`` tile stored row by row, each row padded by ``pad_words`` 4-byte words."""
    return TileLayout(rows, cols, element_bytes, "row", cols + pad_elements(pad_words, element_bytes))


def padded(rows: int, cols: int, element_bytes: int = 4, pad_words: int = 1) -> TileLayout:
    """Row-major with a skew: each row starts ``pad_words`` banks after the previous one would.

    +1 word fixes a 4-byte column read, +2 an 8-byte one, +4 a 16-byte one (any odd multiple of the
    access works); +32 words is a whole turn of the banks and changes nothing.
    """
    return row_major(rows, cols, element_bytes, pad_words)


def doubled(rows: int, cols: int, element_bytes: int = 4) -> TileLayout:
    """The source's padding: rows ``compute_padded_headdim(cols)`` elements wide (a power of two is doubled)."""
    return TileLayout(rows, cols, element_bytes, "row", compute_padded_headdim(cols),
                      name=f"{rows}×{cols} in rows of {compute_padded_headdim(cols)} (the source's doubling), "
                           f"{element_bytes}-byte elements")


def transposed(rows: int, cols: int, element_bytes: int = 4, pad_words: int = 0) -> TileLayout:
    """The logical ``rows × cols`` tile stored column by column (K stored as Kᵀ: v2_kt's tile)."""
    return TileLayout(rows, cols, element_bytes, "col", rows + pad_elements(pad_words, element_bytes))


def xor_swizzled(rows: int, cols: int, element_bytes: int = 4, period: int = 8, per_phase: int = 1,
                 pad_words: int = 0) -> TileLayout:
    """Row-major with the 16-byte chunks of row r permuted: chunk j goes to ``j XOR ((r // per_phase) % period)``.

    ``period=8`` on 128-byte rows is the "128-byte swizzle" of CUTLASS (``Swizzle<3,4,3>``) and of
    Triton's ``nvmma_shared`` layouts for the tensor cores; Triton's ``swizzled_shared`` layouts use
    the same XOR with their ``vec`` / ``perPhase`` / ``maxPhase`` parameters.
    """
    return TileLayout(rows, cols, element_bytes, "row", cols + pad_elements(pad_words, element_bytes),
                      swizzle_period=period, swizzle_per_phase=per_phase)
