"""Shared-memory bank simulator: which words a warp asks for, and how many wavefronts that costs.

Shared memory is split into 32 banks of 4-byte words: the word at byte address ``a`` lives in bank
``(a // 4) % 32``. A warp-wide load is served in *wavefronts*; one wavefront delivers at most one
word from each bank. The model used throughout the course (the public contract of this module):

* a request is served in **phases**: all 32 lanes at once for 4-byte accesses, lanes 0–15 then
  16–31 for 8-byte accesses, four groups of 8 lanes for 16-byte accesses (a phase moves at most
  128 bytes, the width of the 32 banks);
* within a phase, lanes that read the same 4-byte word share it (**broadcast**);
* a phase needs as many wavefronts as the largest number of *distinct* words that fall into one
  bank (an 8- or 16-byte access covers 2 or 4 consecutive words, so 2 or 4 banks);
* the request costs the sum over its phases. The ideal is one wavefront per phase (1, 2 or 4).

It is a model: NVIDIA does not document the exact rules, and the hardware can do better in some
cases (Nsight Compute sometimes counts fewer wavefronts when lanes of *different* phases read the
same address). Notebook 06 compares its predictions with Nsight Compute's counters.

Lanes: a request always has 32 entries (lane i's address at index i); an entry may be ``None`` for
an inactive (masked) lane. A phase with no active lane costs nothing.

The module also builds the access patterns the course discusses (a warp reading a row or a column of
a tile stored row-major, padded, doubled, transposed or XOR-swizzled), a model of the shared-memory
loads Triton emits for the CUDA-core (FMA) ``tl.dot`` of the v2 kernels, the pictures, and helpers
that read the recorded Nsight Compute and compiled-layout measurements.
"""

from __future__ import annotations

import math
import numbers
import re
from collections import Counter
from dataclasses import dataclass

from flashattn.kernels.v2 import compute_padded_headdim

NUM_BANKS = 32
WORD_BYTES = 4
WARP_SIZE = 32
ACCESS_BYTES = (4, 8, 16)
CHUNK_BYTES = 16  # the unit an XOR swizzle permutes (one 128-bit vector)


# --- validation -------------------------------------------------------------------------------


def _check_int(value, name: str, *, minimum: int | None = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_access_bytes(access_bytes) -> int:
    if isinstance(access_bytes, bool) or not isinstance(access_bytes, numbers.Integral):
        raise TypeError(f"access_bytes must be an int (4, 8 or 16), got {type(access_bytes).__name__} "
                        f"{access_bytes!r}")
    if access_bytes not in ACCESS_BYTES:
        raise ValueError(f"access_bytes must be 4, 8 or 16 (a 32-, 64- or 128-bit load), got {access_bytes}")
    return int(access_bytes)


def _check_addresses(byte_addresses, access_bytes: int) -> list[int | None]:
    if isinstance(byte_addresses, (str, bytes)) or not hasattr(byte_addresses, "__len__"):
        raise TypeError(f"byte_addresses must be a sequence of {WARP_SIZE} ints (one per lane, None for an "
                        f"inactive lane), got {type(byte_addresses).__name__}")
    if hasattr(byte_addresses, "tolist"):  # numpy array or torch tensor
        byte_addresses = byte_addresses.tolist()
    addresses = list(byte_addresses)
    if len(addresses) != WARP_SIZE:
        raise ValueError(f"a warp request has exactly {WARP_SIZE} lanes (use None for an inactive lane), "
                         f"got {len(addresses)} addresses")
    checked = []
    for lane, a in enumerate(addresses):
        if a is None:
            checked.append(None)
            continue
        if isinstance(a, bool) or not isinstance(a, numbers.Integral):
            raise TypeError(f"lane {lane}: addresses must be ints (or None for an inactive lane), "
                            f"got {type(a).__name__} {a!r}")
        a = int(a)
        if a < 0:
            raise ValueError(f"lane {lane}: byte address {a} is negative")
        if a % access_bytes:
            raise ValueError(f"lane {lane}: byte address {a} is not aligned to the {access_bytes}-byte access "
                             f"(a {8 * access_bytes}-bit load needs an address that is a multiple of {access_bytes})")
        checked.append(a)
    if all(a is None for a in checked):
        raise ValueError("no active lane: at least one address must be an int")
    return checked


# --- the model --------------------------------------------------------------------------------


def bank(byte_address) -> int:
    """The bank of a byte address: ``(byte_address // 4) % 32``."""
    a = _check_int(byte_address, "byte_address")
    return (a // WORD_BYTES) % NUM_BANKS


def words_per_access(access_bytes: int) -> int:
    """4-byte words one lane's access covers: 1, 2 or 4."""
    return _check_access_bytes(access_bytes) // WORD_BYTES


def lanes_per_phase(access_bytes: int) -> int:
    """Lanes served together: 32 for 4-byte, 16 for 8-byte, 8 for 16-byte accesses."""
    return WARP_SIZE // words_per_access(access_bytes)


@dataclass(frozen=True)
class Phase:
    """One phase of a request: its lanes, the distinct words per bank, and its wavefronts."""

    lanes: tuple[int, ...]  # the active lanes of this phase
    words_per_bank: tuple[int, ...]  # distinct 4-byte words requested from each of the 32 banks
    wavefronts: int  # max(words_per_bank), 0 when no lane is active

    @property
    def worst_bank(self) -> int | None:
        if not self.wavefronts:
            return None
        return max(range(NUM_BANKS), key=lambda b: self.words_per_bank[b])


@dataclass(frozen=True)
class Request:
    """A warp-wide request analysed phase by phase (see :func:`analyze`)."""

    addresses: tuple[int | None, ...]
    access_bytes: int
    phases: tuple[Phase, ...]

    @property
    def wavefronts(self) -> int:
        return sum(p.wavefronts for p in self.phases)

    @property
    def ideal(self) -> int:
        """One wavefront per phase that has an active lane (1, 2 or 4 for a full warp)."""
        return sum(1 for p in self.phases if p.lanes)

    @property
    def conflict_ways(self) -> float:
        return self.wavefronts / self.ideal

    def describe(self) -> str:
        per_phase = " + ".join(str(p.wavefronts) for p in self.phases)
        phases = f" ({len(self.phases)} phases: {per_phase})" if len(self.phases) > 1 else ""
        return (f"{self.wavefronts} wavefront{'s' if self.wavefronts != 1 else ''}{phases}, ideal {self.ideal}: "
                f"{_ways_text(self.conflict_ways)}")


def _ways_text(ways: float) -> str:
    if ways == 1:
        return "conflict-free"
    return f"{ways:g}-way conflict"


def analyze(byte_addresses, access_bytes: int = 4) -> Request:
    """The request phase by phase: which lanes, how many distinct words per bank, how many wavefronts."""
    access_bytes = _check_access_bytes(access_bytes)
    addresses = _check_addresses(byte_addresses, access_bytes)
    words, per_phase = access_bytes // WORD_BYTES, lanes_per_phase(access_bytes)
    phases = []
    for start in range(0, WARP_SIZE, per_phase):
        lanes = tuple(i for i in range(start, start + per_phase) if addresses[i] is not None)
        distinct = {addresses[i] // WORD_BYTES + w for i in lanes for w in range(words)}  # broadcast
        per_bank = Counter(word % NUM_BANKS for word in distinct)
        counts = tuple(per_bank.get(b, 0) for b in range(NUM_BANKS))
        phases.append(Phase(lanes=lanes, words_per_bank=counts, wavefronts=max(counts)))
    return Request(addresses=tuple(addresses), access_bytes=access_bytes, phases=tuple(phases))


def wavefronts(byte_addresses, access_bytes: int = 4) -> int:
    """Wavefronts needed to serve one warp-wide request; lane i reads ``access_bytes`` at ``byte_addresses[i]``.

    ``byte_addresses`` has 32 entries (``None`` for an inactive lane); ``access_bytes`` is 4, 8 or 16.
    Per phase (32, 16 or 8 lanes), the largest number of distinct 4-byte words in one bank; summed.
    """
    return analyze(byte_addresses, access_bytes).wavefronts


def ideal_wavefronts(access_bytes: int = 4) -> int:
    """The conflict-free cost of a full-warp request: the number of phases (1, 2 or 4)."""
    return words_per_access(access_bytes)


def conflict_ways(byte_addresses, access_bytes: int = 4) -> float:
    """Wavefronts divided by the ideal (the number of phases with an active lane): 1.0 = conflict-free."""
    return analyze(byte_addresses, access_bytes).conflict_ways


# --- tile layouts in shared memory ------------------------------------------------------------


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
            _check_int(getattr(self, field_name), field_name, minimum=1)
        if self.element_bytes not in (1, 2, 4, 8):
            raise ValueError(f"element_bytes must be 1, 2, 4 or 8, got {self.element_bytes}")
        if self.order not in ("row", "col"):
            raise ValueError(f"order must be 'row' (row-major) or 'col' (column-major), got {self.order!r}")
        stride = self.line_length if self.line_stride is None else _check_int(self.line_stride, "line_stride")
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
    pad_words = _check_int(pad_words, "pad_words")
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


# --- warp access patterns ---------------------------------------------------------------------


@dataclass(frozen=True)
class WarpRead:
    """One warp-wide read of a tile: which elements each lane reads, and their byte addresses."""

    layout: TileLayout
    access_bytes: int
    lane_elements: tuple[tuple[tuple[int, int], ...], ...]  # per lane, the (row, col) it reads
    addresses: tuple[int, ...]  # per lane, the byte address of its access
    description: str

    def analyze(self) -> Request:
        return analyze(self.addresses, self.access_bytes)

    @property
    def wavefronts(self) -> int:
        return wavefronts(self.addresses, self.access_bytes)

    @property
    def conflict_ways(self) -> float:
        return conflict_ways(self.addresses, self.access_bytes)


def _vector_width(layout: TileLayout, access_bytes) -> tuple[int, int]:
    if access_bytes is None:
        access_bytes = max(WORD_BYTES, layout.element_bytes)
    access_bytes = _check_access_bytes(access_bytes)
    if access_bytes % layout.element_bytes:
        raise ValueError(f"a {access_bytes}-byte access does not hold whole {layout.element_bytes}-byte elements")
    return access_bytes, access_bytes // layout.element_bytes


def _warp_read(layout: TileLayout, access_bytes: int, vec: int, starts, description: str) -> WarpRead:
    """Lane i reads ``vec`` elements from ``starts[i]`` along the layout's stored lines."""
    step = (0, 1) if layout.order == "row" else (1, 0)
    lane_elements, addresses = [], []
    for lane, (r, c) in enumerate(starts):
        elements = tuple((r + k * step[0], c + k * step[1]) for k in range(vec))
        try:
            addrs = [layout.byte_address(*e) for e in elements]
        except ValueError as err:
            raise ValueError(f"lane {lane} would read past the tile ({err}); "
                             "use a larger tile or a smaller read") from None
        if any(b - a != layout.element_bytes for a, b in zip(addrs, addrs[1:], strict=False)):
            raise ValueError(f"lane {lane}: elements {elements[0]}..{elements[-1]} are not contiguous in this layout, "
                             f"so one {access_bytes}-byte access cannot read them")
        if addrs[0] % access_bytes:
            raise ValueError(f"lane {lane}: element {elements[0]} is at byte {addrs[0]}, not aligned to the "
                             f"{access_bytes}-byte access (pad rows by a multiple of "
                             f"{access_bytes // WORD_BYTES} words)")
        lane_elements.append(elements)
        addresses.append(addrs[0])
    return WarpRead(layout, access_bytes, tuple(lane_elements), tuple(addresses), description)


def _plus(start: int, term: str) -> str:
    return term if start == 0 else f"{start}+{term}"


def column_read(layout: TileLayout, col: int = 0, first_row: int = 0, access_bytes: int | None = None) -> WarpRead:
    """A warp reads down column ``col`` of the logical tile, one lane after another.

    Scalar accesses: lane i reads ``(first_row + i, col)``. With vectors (``access_bytes`` wider than an
    element) each lane reads along the stored line: in a row-major layout lane i reads row
    ``first_row + i``, elements ``col .. col+vec-1``; in a column-major layout the column itself is
    contiguous, so lane i reads rows ``first_row + vec·i ..`` (continuing in the next column past the
    last row). ``access_bytes`` defaults to one 4-byte word.
    """
    access_bytes, vec = _vector_width(layout, access_bytes)
    col, first_row = _check_int(col, "col"), _check_int(first_row, "first_row")
    if layout.order == "row":
        starts = [(first_row + i, col) for i in range(WARP_SIZE)]
        what = f"lane i reads row {_plus(first_row, 'i')}, column {col}" + (f"..{col + vec - 1}" if vec > 1 else "")
    else:
        flat = [col * layout.rows + first_row + vec * i for i in range(WARP_SIZE)]
        starts = [(f % layout.rows, f // layout.rows) for f in flat]
        what = (f"lane i reads rows {_plus(first_row, f'{vec}i')}..{_plus(first_row, f'{vec}i')}+{vec - 1} "
                f"of column {col} (then the next column)" if vec > 1
                else f"lane i reads row {_plus(first_row, 'i')}, column {col}")
    return _warp_read(layout, access_bytes, vec, starts, f"column read, {access_bytes}-byte accesses: {what}")


def row_read(layout: TileLayout, row: int = 0, first_col: int = 0, access_bytes: int | None = None) -> WarpRead:
    """A warp reads along row ``row`` of the logical tile (continuing in the next row past the last column).

    In a row-major layout lane i reads elements ``first_col + vec·i ..`` of the row; in a
    column-major layout the vector runs down the column (rows ``row .. row+vec-1``, column
    ``first_col + i``).
    """
    access_bytes, vec = _vector_width(layout, access_bytes)
    row, first_col = _check_int(row, "row"), _check_int(first_col, "first_col")
    if layout.order == "row":
        flat = [row * layout.cols + first_col + vec * i for i in range(WARP_SIZE)]
        starts = [(f // layout.cols, f % layout.cols) for f in flat]
        lane_col = _plus(first_col, f"{vec}i" if vec > 1 else "i")
        what = f"lane i reads row {row}, column {lane_col}" + (f"..{lane_col}+{vec - 1}" if vec > 1 else "")
    else:
        starts = [(row, first_col + i) for i in range(WARP_SIZE)]
        what = f"lane i reads column {_plus(first_col, 'i')}, row {row}" + (f"..{row + vec - 1}" if vec > 1 else "")
    return _warp_read(layout, access_bytes, vec, starts, f"row read, {access_bytes}-byte accesses: {what}")


def column_read_ways(D: int, pad_words: int = 0, access_bytes: int = 4, element_bytes: int = 4) -> float:
    """Worst conflict degree over the columns of a 32-row, D-wide row-major tile read column-wise."""
    layout = row_major(WARP_SIZE, D, element_bytes, pad_words)
    _, vec = _vector_width(layout, access_bytes)
    return max(column_read(layout, c, 0, access_bytes).conflict_ways for c in range(0, D - vec + 1, vec))


# --- the K tile of v2 against v2_kt -------------------------------------------------------------


def k_tile_wavefronts(D: int, variant: str = "v2", *, block_n: int = 64, element_bytes: int = 4) -> int:
    """Simple model: wavefronts to read every column of one K tile, a warp of 32 lanes at a time.

    It assumes each lane owns one key row ``n`` and, at reduction step ``d``, reads ``K[n, d]`` with a
    4-byte load: lanes ``0..31`` read rows ``0..31`` (then ``32..63``) of column ``d``. ``v2`` (and
    ``v2_kt_view``, whose shared tile Triton lays out like v2's) stores the tile row-major
    ``(block_n, D)``: a column read. ``v2_kt`` stores it as ``(D, block_n)``: the same values lie along
    a stored row. ``v2_padded`` stores rows ``max(16, compute_padded_headdim(D))`` wide and reads that
    many columns (the kernel's D_PAD).
    Triton's real loads differ (vectors, several keys per lane, broadcast): see :func:`fma_loop_loads`.
    """
    D, block_n = _check_int(D, "D", minimum=1), _check_int(block_n, "block_n", minimum=1)
    if block_n % WARP_SIZE:
        raise ValueError(f"block_n must be a multiple of {WARP_SIZE} for this model, got {block_n}")
    if variant in ("v2", "v2_kt_view"):
        layout, width = row_major(block_n, D, element_bytes), D
    elif variant == "v2_padded":  # the kernel's tile is D_PAD wide: the zero columns are read too
        width = max(16, compute_padded_headdim(D))
        layout = row_major(block_n, width, element_bytes)
    elif variant == "v2_kt":
        layout, width = transposed(block_n, D, element_bytes), D
    else:
        raise ValueError(f"unknown variant {variant!r}; accepted: v2, v2_kt, v2_kt_view, v2_padded")
    access = max(WORD_BYTES, element_bytes)
    return sum(column_read(layout, d, first, access).wavefronts
               for d in range(0, width, access // element_bytes) for first in range(0, block_n, WARP_SIZE))


# --- Triton's loads on the CUDA-core path -----------------------------------------------------

FMA_SIZE_PER_THREAD = (4, 4)
"""Elements per thread of the output tile of an FMA ``tl.dot``, as Triton chose them (see fma_threads_per_warp)."""


def fma_threads_per_warp(n: int) -> tuple[int, int]:
    """Lanes along (M, N) of the output tile of an FMA ``tl.dot`` with N columns.

    The rule Triton 3.9 followed for sm_90 when this module was written (read from the TTGIR of the
    v2 kernels: ``sizePerThread = [4, 4]``, ``threadsPerWarp = [2, 16]`` for 64 columns, ``[4, 8]``
    for 32, ``[1, 32]`` for 128; ``warpsPerCTA = [num_warps, 1]``). Other Triton versions may choose
    differently: notebook 06 shows the recorded compiled layouts next to the model.
    """
    along_n = max(1, min(WARP_SIZE, n // FMA_SIZE_PER_THREAD[1]))
    return WARP_SIZE // along_n, along_n


@dataclass(frozen=True)
class OperandLoads:
    """The shared-memory loads of one ``tl.dot`` operand, per warp and per loop iteration."""

    dot: str  # "Q·Kᵀ" or "P·V"
    operand: str  # "Q", "K", "P", "V"
    tile: str  # how the tile is stored
    instructions: int  # warp-wide load instructions
    access_bytes: int
    wavefronts: int  # summed over the instructions

    @property
    def ideal(self) -> int:
        return self.instructions * ideal_wavefronts(self.access_bytes)

    @property
    def conflict_ways(self) -> float:
        return self.wavefronts / self.ideal


def _fma_a_loads(M: int, K: int, num_warps: int, n: int) -> tuple[int, int]:
    """A (M×K, row-major, K contiguous): per row of the thread and 4-wide k chunk, one 16-byte load."""
    tpw_m, tpw_n = fma_threads_per_warp(n)
    rows_per_warp_rep = FMA_SIZE_PER_THREAD[0] * tpw_m
    reps = max(1, M // (rows_per_warp_rep * num_warps))
    total_wf = count = 0
    for rep in range(reps):
        base = rep * rows_per_warp_rep * num_warps  # warp 0; other warps are shifted copies
        for i in range(FMA_SIZE_PER_THREAD[0]):
            for kq in range(0, K, 4):
                rows = [base + FMA_SIZE_PER_THREAD[0] * (lane // tpw_n) + i for lane in range(WARP_SIZE)]
                total_wf += wavefronts([(r * K + kq) * 4 for r in rows], 16)
                count += 1
    return count, total_wf


def _fma_b_loads(K: int, N: int, k_contiguous: bool) -> tuple[int, int]:
    """B (K×N). k_contiguous: stored as (N, K) rows (Kᵀ of a row-major tile); else (K, N) row-major."""
    _, tpw_n = fma_threads_per_warp(N)
    groups = [lane % tpw_n for lane in range(WARP_SIZE)]
    total_wf = count = 0
    if k_contiguous:  # each lane: its 4 columns n, 4 consecutive k each
        for j in range(FMA_SIZE_PER_THREAD[1]):
            for kq in range(0, K, 4):
                total_wf += wavefronts([((FMA_SIZE_PER_THREAD[1] * g + j) * K + kq) * 4 for g in groups], 16)
                count += 1
    else:  # each lane: its 4 consecutive columns n at one k
        for k in range(K):
            total_wf += wavefronts([(k * N + FMA_SIZE_PER_THREAD[1] * g) * 4 for g in groups], 16)
            count += 1
    return count, total_wf


def fma_loop_loads(variant: str, D: int, *, block_m: int = 64, block_n: int = 64,
                   num_warps: int = 4) -> list[OperandLoads]:
    """Model of the shared-memory loads one warp issues per K/V block on the float32 FMA path.

    What it assumes (taken from Triton's compiled v2 kernels for sm_90, float32 with
    ``input_precision="ieee"``): both ``tl.dot`` operands go through shared memory; the tiles are
    stored without swizzle in the order of their global-memory rows (so ``v2_kt_view``, whose global
    K is still D-contiguous, gets v2's tile); the output of each dot is spread as
    :data:`FMA_SIZE_PER_THREAD` elements per thread over :func:`fma_threads_per_warp` lanes, warps
    stacked along M; every load is a 16-byte vector along the stored rows. Lanes that hold the same
    rows or columns load the same addresses (broadcast within a phase, counted again in another
    phase, as in :func:`wavefronts`). Not modelled: the few loads of layout conversions and
    reductions, and the stores.
    """
    if variant not in ("v2", "v2_kt", "v2_kt_view", "v2_padded"):
        raise ValueError(f"unknown variant {variant!r}; accepted: v2, v2_kt, v2_kt_view, v2_padded")
    for name, value in (("D", D), ("block_m", block_m), ("block_n", block_n), ("num_warps", num_warps)):
        _check_int(value, name, minimum=1)
    d = max(16, compute_padded_headdim(D)) if variant == "v2_padded" else D
    if d % 4 or block_n % 4 or block_m % 4:
        raise ValueError(f"the model needs D, block_m and block_n to be multiples of 4, got {d}, {block_m}, {block_n}")
    k_contiguous = variant != "v2_kt"
    k_tile = f"({block_n}, {d}) row-major" if k_contiguous else f"({d}, {block_n}) row-major (Kᵀ)"
    parts = [
        ("Q·Kᵀ", "Q", f"({block_m}, {d}) row-major", 16, *_fma_a_loads(block_m, d, num_warps, block_n)),
        ("Q·Kᵀ", "K", k_tile, 16, *_fma_b_loads(d, block_n, k_contiguous)),
        ("P·V", "P", f"({block_m}, {block_n}) row-major", 16, *_fma_a_loads(block_m, block_n, num_warps, d)),
        ("P·V", "V", f"({block_n}, {d}) row-major", 16, *_fma_b_loads(block_n, d, False)),
    ]
    return [OperandLoads(dot, op, tile, count, access, wf) for dot, op, tile, access, count, wf in parts]


def fma_loop_summary(D: int, *, block_m: int = 64, block_n: int = 64, num_warps: int = 4,
                     variants=("v2", "v2_kt")) -> dict:
    """Per-warp, per-iteration instructions and wavefronts of :func:`fma_loop_loads` for each variant."""
    out = {}
    for v in variants:
        loads = fma_loop_loads(v, D, block_m=block_m, block_n=block_n, num_warps=num_warps)
        out[v] = {
            "instructions": sum(x.instructions for x in loads),
            "wavefronts": sum(x.wavefronts for x in loads),
            "k_wavefronts": sum(x.wavefronts for x in loads if x.operand == "K"),
            "loads": loads,
        }
    return out


def predicted_ratios(D: int, *, block_m: int = 64, block_n: int = 64, num_warps: int = 4) -> dict:
    """Wavefronts of v2 divided by those of v2_kt, three ways (all float32).

    * ``simple``: the K tile only, one lane per key row, 4-byte loads (:func:`k_tile_wavefronts`);
    * ``k_tile_triton``: the K tile only, with Triton's vector loads and lane layout (:func:`fma_loop_loads`);
    * ``loop_triton``: all four operand tiles of one iteration (Q, K, P, V), which is closest to
      what Nsight Compute counts over the whole kernel.
    """
    s = fma_loop_summary(D, block_m=block_m, block_n=block_n, num_warps=num_warps)
    return {
        "simple": k_tile_wavefronts(D, "v2", block_n=block_n) / k_tile_wavefronts(D, "v2_kt", block_n=block_n),
        "k_tile_triton": s["v2"]["k_wavefronts"] / s["v2_kt"]["k_wavefronts"],
        "loop_triton": s["v2"]["wavefronts"] / s["v2_kt"]["wavefronts"],
    }


def fma_num_warps(D: int) -> int:
    """Warps of the float32 v2 kernels on a GPU (mirrors ``kernels.v2.default_options``; tested against it)."""
    return 4 if D <= 32 else 8


# --- recorded measurements (Nsight Compute, compiled layouts) -----------------------------------

NCU_WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
NCU_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
NCU_STORE_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
NCU_INSTRUCTIONS = "smsp__inst_executed_op_shared_ld.sum"
NCU_TIME_NS = "gpu__time_duration.sum"


def load_recorded(name: str, gpu: str | None = None, data_dir=None) -> dict | None:
    """A recorded measurement with its provenance, or None when it has not been recorded yet."""
    from flashattn.measure import recorded

    try:
        return recorded.get(name, gpu=gpu, data_dir=data_dir)
    except (KeyError, FileNotFoundError):
        return None


def _metric(row: dict, key: str) -> float | None:
    value = (row.get("metrics") or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def ncu_rows(entry: dict | None, path: str | None = None) -> list[dict]:
    """Rows of a recorded 'bank_conflicts' entry (optionally one path), each with its derived numbers.

    Adds ``wavefronts``, ``conflicts``, ``instructions``, ``time_ms``, ``wavefronts_per_instruction``
    and ``conflict_share`` (conflicts ÷ wavefronts) where the metrics are present (None otherwise).
    """
    out = []
    for row in (entry or {}).get("rows", []) or []:
        if not isinstance(row, dict) or (path is not None and row.get("path") != path):
            continue
        wf, conf, inst = (_metric(row, k) for k in (NCU_WAVEFRONTS, NCU_CONFLICTS, NCU_INSTRUCTIONS))
        t = _metric(row, NCU_TIME_NS)
        out.append({
            **row,
            "wavefronts": wf, "conflicts": conf, "instructions": inst,
            "time_ms": t / 1e6 if t is not None else None,
            "wavefronts_per_instruction": wf / inst if wf is not None and inst else None,
            "conflict_share": conf / wf if conf is not None and wf else None,
        })
    return out


def _fmt_ratio(x: float) -> str:
    return f"{x:.2f}×"


def _tuple_of_ints(text) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)) if isinstance(text, str) else ()


def launch_config(row: dict) -> dict:
    """``block_m``, ``block_n``, ``num_warps`` of a recorded row, from what it gives.

    ``num_warps``: the row's own, else the launch's threads per block ÷ 32 (``launch__block_size`` or
    the ``block`` string), else the float32 GPU default. ``block_m``: the row's own, else N ÷ the
    grid's first dimension (one program per Q block), else 64. ``block_n``: the row's own, else 64
    (v2's float32 default on a GPU).
    """
    D = row.get("D")
    threads = (row.get("metrics") or {}).get("launch__block_size") or (_tuple_of_ints(row.get("block")) or (0,))[0]
    num_warps = row.get("num_warps") or (int(threads) // WARP_SIZE if threads else None)
    if not num_warps:
        num_warps = fma_num_warps(D) if isinstance(D, int) else 4
    grid = _tuple_of_ints(row.get("grid"))
    block_m = row.get("block_m")
    if not block_m and grid and isinstance(row.get("N"), int) and grid[0]:
        block_m = 1 << max(0, math.ceil(math.log2(row["N"] / grid[0])))  # Q blocks are powers of two
    return {"block_m": block_m or 64, "block_n": row.get("block_n") or 64, "num_warps": num_warps}


def compare_with_ncu(entry: dict | None, path: str = "fp32_ieee") -> list[dict]:
    """The model's v2 ÷ v2_kt wavefront ratios next to Nsight Compute's, one dict per head dimension.

    Each dict: ``D``; ``measured`` (v2 ÷ v2_kt shared-load wavefronts, None when a row is missing);
    ``predicted`` (:func:`predicted_ratios`); ``per_instruction`` (wavefronts per shared-load
    instruction, measured and modelled, for v2 and v2_kt); ``instructions`` (measured) and
    ``predicted_instructions`` (the model's loads per warp and iteration × warps × iterations ×
    programs); the launch configuration used; and ``text``, the comparison in words.
    """
    rows = ncu_rows(entry, path)
    out = []
    for D in sorted({r.get("D") for r in rows if isinstance(r.get("D"), int)}):
        by = {r.get("variant"): r for r in rows if r.get("D") == D}
        v2, kt = by.get("v2"), by.get("v2_kt")
        config = launch_config(v2 or kt)
        summary = fma_loop_summary(D, **config)
        item = {"D": D, **config, "measured": None, "predicted": predicted_ratios(D, **config),
                "per_instruction": {}, "instructions": {}, "predicted_instructions": None}
        if v2 and kt and v2["wavefronts"] and kt["wavefronts"]:
            item["measured"] = v2["wavefronts"] / kt["wavefronts"]
            item["instructions"] = {"v2": v2["instructions"], "v2_kt": kt["instructions"]}
            item["per_instruction"] = {
                name: {"measured": row["wavefronts_per_instruction"],
                       "model": summary[name]["wavefronts"] / summary[name]["instructions"]}
                for name, row in (("v2", v2), ("v2_kt", kt))}
            if all(isinstance(v2.get(k), int) for k in ("B", "H", "N")):
                programs = math.ceil(v2["N"] / config["block_m"]) * v2["B"] * v2["H"]
                item["predicted_instructions"] = (programs * math.ceil(v2["N"] / config["block_n"])
                                                  * config["num_warps"] * summary["v2"]["instructions"])
        item["text"] = _comparison_text(item)
        out.append(item)
    return out


def _comparison_text(item: dict) -> str:
    D, p, m = item["D"], item["predicted"], item["measured"]
    head = (f"D={D}, v2 ÷ v2_kt shared-load wavefronts: simple model (K tile only) {_fmt_ratio(p['simple'])}, "
            f"Triton's loads (K tile only) {_fmt_ratio(p['k_tile_triton'])}, Triton's loads (Q, K, P and V) "
            f"{_fmt_ratio(p['loop_triton'])}")
    if m is None:
        return head + "; Nsight Compute: not recorded for both v2 and v2_kt."
    closest = min(p, key=lambda k: abs(math.log(m / p[k])))
    off = m / p[closest] - 1
    names = {"simple": "the simple model", "k_tile_triton": "the K-tile model of Triton's loads",
             "loop_triton": "the whole-iteration model of Triton's loads"}
    verdict = (f"within {abs(off):.0%} of {names[closest]}" if abs(off) <= 0.25
               else f"closest to {names[closest]} but {abs(off):.0%} {'above' if off > 0 else 'below'} it")
    lines = [f"{head}. Nsight Compute measured {_fmt_ratio(m)}: {verdict}."]
    inst, pred_inst = item["instructions"], item["predicted_instructions"]
    if inst.get("v2") and inst.get("v2_kt"):
        same = abs(inst["v2"] / inst["v2_kt"] - 1) < 0.02
        text = (f"Both variants executed {'the same number of' if same else 'different numbers of'} shared-load "
                f"instructions ({inst['v2']:.4g} and {inst['v2_kt']:.4g})")
        if pred_inst:
            text += f"; the model predicts {pred_inst:.4g} ({inst['v2'] / pred_inst - 1:+.0%})"
        lines.append(text + ".")
    per = item["per_instruction"]
    if per and all(per[v]["measured"] for v in per):
        mv, mk = per["v2"]["measured"], per["v2_kt"]["measured"]
        pv, pk = per["v2"]["model"], per["v2_kt"]["model"]
        lines.append(f"Per instruction: v2 {mv:.2f} wavefronts (model {pv:.2f}), v2_kt {mk:.2f} (model {pk:.2f}); "
                     f"v2's extra wavefronts per instruction (v2 minus v2_kt), the cost of its conflicts: "
                     f"{mv - mk:.2f} measured, {pv - pk:.2f} modelled ({(mv - mk) / (pv - pk) - 1:+.0%}).")
        if mk < 0.95 * pk and abs((mv - mk) / (pv - pk) - 1) <= 0.1:
            lines.append("So the model gets the conflicts right, and the hardware serves the conflict-free loads "
                         "more cheaply than the model charges (fewer wavefronts than one per phase: it appears to "
                         "merge lanes 16-31 with lanes 0-15 when they read the same addresses). A cheaper "
                         "baseline raises the ratio.")
    if m < p["simple"]:
        lines.append(f"The simple model's {_fmt_ratio(p['simple'])} is an upper bound for the K loads alone; Q, P "
                     "and V are read from shared memory too, conflict-free in both variants.")
    return " ".join(lines)


_LAYOUT_RE = re.compile(r"#?(?P<alias>[\w.]+)?\s*=?\s*#ttg\.(?P<kind>\w+)<\{(?P<body>[^}]*)\}>")


def parse_shared_layout(line: str) -> dict:
    """Parse one TTGIR shared-encoding line, e.g. ``#shared = #ttg.swizzled_shared<{vec = 1, ...}>``.

    Returns ``{"alias", "kind", "params": {name: int | bool | list | str}}``; raises ValueError when the
    line is not a ``#ttg.<kind><{...}>`` definition.
    """
    if not isinstance(line, str):
        raise TypeError(f"expected a TTGIR line (str), got {type(line).__name__}")
    m = _LAYOUT_RE.search(line)
    if not m:
        raise ValueError(f"not a TTGIR layout definition: {line!r}")
    params = {}
    for key, value in re.findall(r"(\w+)\s*=\s*(\[[^\]]*\]|[^,]+)", m.group("body")):
        value = value.strip()
        if value.startswith("["):
            params[key] = [int(x) for x in re.findall(r"-?\d+", value)]
        elif value in ("true", "false"):
            params[key] = value == "true"
        elif re.fullmatch(r"-?\d+", value):
            params[key] = int(value)
        else:
            params[key] = value
    return {"alias": m.group("alias"), "kind": m.group("kind"), "params": params}


def layout_signature(row: dict) -> tuple:
    """The shared encodings of a recorded compiled-layouts row, without their names (for comparisons)."""
    found = []
    for line in row.get("shared_layouts") or []:
        try:
            layout = parse_shared_layout(line)
        except (ValueError, TypeError):
            continue
        found.append((layout["kind"], tuple(sorted((k, str(v)) for k, v in layout["params"].items()))))
    return tuple(sorted(found))


def describe_shared_layout(layout: dict) -> str:
    """In words: whether a parsed shared layout swizzles, and how."""
    kind, p = layout.get("kind"), layout.get("params", {})
    if kind == "swizzled_shared":
        if p.get("maxPhase", 1) <= 1:
            return f"plain (no swizzle; order {p.get('order')})"
        return (f"XOR-swizzled: {p.get('vec')}-element vectors XOR ((row // {p.get('perPhase')}) mod "
                f"{p.get('maxPhase')}); order {p.get('order')}")
    if kind == "nvmma_shared":
        width = p.get("swizzlingByteWidth", 0)
        trans = ", transposed" if p.get("transposed") else ""
        if not width:
            return f"tensor-core layout, no swizzle{trans}"
        return (f"tensor-core layout, {width}-byte swizzle: 16-byte chunks XOR (row mod {width // CHUNK_BYTES})"
                f"{trans}, {p.get('elementBitWidth')}-bit elements")
    if kind == "padded_shared":
        return f"padded shared layout {p}"
    return f"{kind} {p}"


def compiled_layout_rows(entry: dict | None) -> list[dict]:
    """Rows of a recorded 'compiled_layouts' entry with their shared layouts parsed and described.

    Adds ``parsed_layouts`` (lines that are not ``#ttg.<kind><{...}>`` definitions are skipped),
    ``lds_counts`` (the shared-load opcodes of ``sass_counts``), ``sass_recorded``, ``hgmma``, ``ffma``.
    """
    out = []
    for row in (entry or {}).get("rows", []) or []:
        if not isinstance(row, dict):
            continue
        parsed = []
        for line in row.get("shared_layouts") or []:
            try:
                layout = parse_shared_layout(line)
            except (ValueError, TypeError):
                continue
            parsed.append({**layout, "text": describe_shared_layout(layout)})
        counts = row.get("sass_counts") or {}
        lds = {k: v for k, v in counts.items() if k == "LDS" or k.startswith("LDS.") or k.startswith("LDSM")}
        out.append({**row, "parsed_layouts": parsed, "lds_counts": lds, "sass_recorded": bool(counts),
                    "hgmma": sum(v for k, v in counts.items() if k.startswith("HGMMA")),
                    "ffma": counts.get("FFMA", 0)})
    return out


# --- the source post's numbers ------------------------------------------------------------------

POST_LABEL = "as reported by the post (RTX 2070, float32)"
POST_REPORTED = {  # show only with POST_LABEL
    "shared_load_requests": 293_601_280,
    "bank_conflicts": 1_174_579_308,
    "wavefronts": 1_845_667_948,
}


def post_derived() -> dict:
    """What follows from the post's three counters: average wavefronts per request, conflict share."""
    r = POST_REPORTED
    return {
        "wavefronts_per_request": r["wavefronts"] / r["shared_load_requests"],
        "conflict_share": r["bank_conflicts"] / r["wavefronts"],
        "conflict_free_per_request": (r["wavefronts"] - r["bank_conflicts"]) / r["shared_load_requests"],
    }


# --- pictures -----------------------------------------------------------------------------------


def bank_colors():
    """32 distinguishable colours, one per bank (a ListedColormap)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    colors = list(plt.get_cmap("tab20").colors) + list(plt.get_cmap("tab20b").colors)
    order = list(range(0, 20, 2)) + list(range(1, 20, 2)) + list(range(20, 32))  # neighbours in different hues
    return ListedColormap([colors[i] for i in order], name="banks")


def _grid(layout: TileLayout, max_rows: int | None, max_cols: int | None):
    """Bank of every logical element (and of the padding), as a 2-D array; padding cells are -1."""
    import numpy as np

    rows = min(layout.rows, max_rows or layout.rows)
    cols = min(layout.cols, max_cols or layout.cols)
    if layout.order == "row":
        shape = (rows, cols + (layout.padding if cols == layout.cols else 0))
    else:
        shape = (rows + (layout.padding if rows == layout.rows else 0), cols)
    grid = np.full(shape, -1, dtype=int)
    for r in range(rows):
        for c in range(cols):
            grid[r, c] = bank(layout.byte_address(r, c))
    return grid, rows, cols


def draw_request(ax, read: WarpRead, *, max_rows: int | None = None, max_cols: int | None = None,
                 title: str | None = None, annotate: bool | None = None, aspect: str = "equal",
                 colorbar: bool = False) -> Request:
    """Draw the tile coloured by bank on ``ax``, the lanes' elements outlined (and labelled with their
    bank when ``annotate``; by default for tiles up to 64×64); returns the analysis."""
    import numpy as np
    from matplotlib.patches import Rectangle

    req = read.analyze()
    touched_rows = max(r for lane in read.lane_elements for r, _ in lane) + 1
    touched_cols = max(c for lane in read.lane_elements for _, c in lane) + 1
    max_rows = max_rows or max(touched_rows, min(read.layout.rows, WARP_SIZE))
    grid, rows, cols = _grid(read.layout, max_rows, max_cols or max(touched_cols, min(read.layout.cols, 64)))
    cmap = bank_colors().with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_less(grid, 0), cmap=cmap, vmin=-0.5, vmax=NUM_BANKS - 0.5, aspect=aspect,
                      interpolation="nearest")
    ax.grid(False)
    if annotate is None:
        annotate = grid.shape[0] * grid.shape[1] <= 64 * 64
    fontsize = 6 if max(grid.shape) <= 40 else 4
    for elements in read.lane_elements:
        for r, c in elements:
            if r < grid.shape[0] and c < grid.shape[1]:
                ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, lw=1.2, ec="black"))
                if annotate:  # the bank number of each element read
                    red, green, blue, _ = cmap(grid[r, c])
                    dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
                    ax.text(c, r, str(grid[r, c]), ha="center", va="center", fontsize=fontsize,
                            color="white" if dark else "#222222")
    if read.layout.padding:
        if read.layout.order == "row" and grid.shape[1] > cols:
            ax.axvline(cols - 0.5, color="#555555", lw=0.8, ls="--")
        elif read.layout.order == "col" and grid.shape[0] > rows:
            ax.axhline(rows - 0.5, color="#555555", lw=0.8, ls="--")
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    ax.set_title(title or f"{read.layout.name}\n{req.describe()}", fontsize=8)
    if colorbar:
        bar = ax.figure.colorbar(image, ax=ax, ticks=range(0, NUM_BANKS, 4), fraction=0.04, pad=0.02)
        bar.set_label("bank")
    return req


def plot_request(read: WarpRead, *, max_rows: int | None = None, max_cols: int | None = None,
                 title: str | None = None):
    """A tile coloured by bank (32 colours), the elements one warp request reads outlined, and below it
    the distinct words the request asks of each bank, phase by phase. Returns a Figure."""
    import matplotlib.pyplot as plt

    from flashattn.teaching import plots

    plots.use_style()
    fig, (ax, ax_bars) = plt.subplots(2, 1, figsize=(7.5, 7.5), gridspec_kw={"height_ratios": [3, 1]})
    req = draw_request(ax, read, max_rows=max_rows, max_cols=max_cols, title=title or read.layout.name,
                       colorbar=True)
    _draw_bank_bars(ax_bars, req)
    fig.suptitle(read.description, fontsize=9)
    fig.tight_layout()
    return fig


def _draw_bank_bars(ax, req: Request) -> None:
    import numpy as np

    bottom = np.zeros(NUM_BANKS)
    shades = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    for i, phase in enumerate(req.phases):
        counts = np.array(phase.words_per_bank)
        ax.bar(range(NUM_BANKS), counts, bottom=bottom, color=shades[i % 4],
               label=f"phase {i}: lanes {phase.lanes[0]}–{phase.lanes[-1]}, {phase.wavefronts} "
                     f"wavefront{'s' if phase.wavefronts != 1 else ''}"
               if phase.lanes else f"phase {i}: no active lane")
        bottom += counts
    ax.set_xlim(-0.5, NUM_BANKS - 0.5)
    ax.set_xticks(range(0, NUM_BANKS, 4))
    ax.set_xlabel("bank")
    ax.set_ylabel("distinct words")
    ax.set_title(req.describe(), fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))


def comparison_layouts(D: int = 32, element_bytes: int = 4, access_bytes: int = 4, block_n: int = 64,
                       swizzle_period: int = 8) -> list[tuple[str, TileLayout]]:
    """The layouts of the side-by-side picture for a (block_n, D) K tile, with short titles.

    Padding is one access wide (+1 word for 4-byte, +2 for 8-byte, +4 for 16-byte accesses).
    """
    pad = _check_access_bytes(access_bytes) // WORD_BYTES
    return [
        ("row-major (v2)", row_major(block_n, D, element_bytes)),
        (f"padded +{pad} word{'s' if pad > 1 else ''}", padded(block_n, D, element_bytes, pad)),
        (f"doubled to {compute_padded_headdim(D)} (the source)", doubled(block_n, D, element_bytes)),
        ("transposed (v2_kt)", transposed(block_n, D, element_bytes)),
        (f"XOR-swizzled (period {swizzle_period})", xor_swizzled(block_n, D, element_bytes, swizzle_period)),
    ]


def plot_layouts(D: int = 32, element_bytes: int = 4, access_bytes: int = 4, block_n: int = 64, col: int = 0):
    """Side by side: the same warp read of column ``col`` of a (block_n, D) K tile in five layouts.

    Returns ``(figure, results)`` where results is a list of ``(title, WarpRead, Request)``.
    """
    import matplotlib.pyplot as plt

    from flashattn.teaching import plots

    plots.use_style()
    layouts = comparison_layouts(D, element_bytes, access_bytes, block_n)
    fig, axes = plt.subplots(1, len(layouts), figsize=(3.2 * len(layouts), 5.2))
    results = []
    for ax, (title, layout) in zip(axes, layouts, strict=True):
        read = column_read(layout, col, 0, access_bytes)
        req = draw_request(ax, read, max_rows=WARP_SIZE if layout.order == "row" else None,
                           title=f"{title}\n{req_line(read)}", annotate=False, aspect="auto")
        results.append((title, read, req))
    fig.suptitle(f"one warp reads column {col} of a {block_n}×{D} K tile ({element_bytes}-byte elements, "
                 f"{access_bytes}-byte accesses); colour = bank, outlined = the elements read", fontsize=10)
    fig.tight_layout()
    return fig, results


def req_line(read: WarpRead) -> str:
    """One line: ``"32 wavefronts (32-way conflict)"``."""
    req = read.analyze()
    return f"{req.wavefronts} wavefront{'s' if req.wavefronts != 1 else ''} ({_ways_text(req.conflict_ways)})"
