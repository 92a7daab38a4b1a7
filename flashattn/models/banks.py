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
same address). Notebook 06b compares its predictions with Nsight Compute's counters.

Lanes: a request always has 32 entries (lane i's address at index i); an entry may be ``None`` for
an inactive (masked) lane. A phase with no active lane costs nothing.

The module also builds the warp requests the course discusses: a warp reading down a column of a
tile in any layout of ``flashattn.models.layouts`` (row-major, padded, doubled, transposed,
XOR-swizzled), and the K tile of v2 against v2_kt. Triton's own loads on the CUDA-core path are
modelled in ``flashattn.models.fma_loads``; the recorded Nsight Compute counters are read in
``flashattn.measure.bank_counters``; the pictures are in ``flashattn.teaching.bank_plots``.
"""

from __future__ import annotations

import numbers
from collections import Counter
from dataclasses import dataclass

from flashattn.kernels.v2 import compute_padded_headdim
from flashattn.models.layouts import WORD_BYTES, TileLayout, check_int, row_major, transposed

NUM_BANKS = 32
WARP_SIZE = 32
ACCESS_BYTES = (4, 8, 16)


# --- validation -------------------------------------------------------------------------------


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
    a = check_int(byte_address, "byte_address")
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

    def short(self) -> str:
        """One line: ``"32 wavefronts (32-way conflict)"``."""
        return f"{self.wavefronts} wavefront{'s' if self.wavefronts != 1 else ''} ({_ways_text(self.conflict_ways)})"

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
    col, first_row = check_int(col, "col"), check_int(first_row, "first_row")
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


def column_read_ways(D: int, pad_words: int = 0, access_bytes: int = 4, element_bytes: int = 4) -> float:
    """Worst conflict degree over the columns of a 32-row, D-wide row-major tile read column-wise."""
    layout = row_major(WARP_SIZE, D, element_bytes, pad_words)
    _, vec = _vector_width(layout, access_bytes)
    return max(column_read(layout, c, 0, access_bytes).conflict_ways for c in range(0, D - vec + 1, vec))


# --- the K tile of v2 against v2_kt -------------------------------------------------------------


# How each variant of notebook 06 stores its K tile in shared memory (v2_kt_view's tile is laid out like
# v2's: Triton orders the tile by K's global strides, which are still D-contiguous).
K_TILES = {"v2": "row-major", "v2_kt": "transposed", "v2_kt_view": "row-major", "v2_padded": "row-major, D_PAD wide"}


def k_tile_width(variant: str, D: int) -> int:
    """Columns of ``variant``'s K tile: D, or v2_padded's D_PAD = max(16, compute_padded_headdim(D))."""
    if variant not in K_TILES:
        raise ValueError(f"unknown variant {variant!r}; accepted: {', '.join(K_TILES)}")
    return max(16, compute_padded_headdim(D)) if variant == "v2_padded" else D


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
    D, block_n = check_int(D, "D", minimum=1), check_int(block_n, "block_n", minimum=1)
    if block_n % WARP_SIZE:
        raise ValueError(f"block_n must be a multiple of {WARP_SIZE} for this model, got {block_n}")
    width = k_tile_width(variant, D)
    if K_TILES[variant] == "transposed":
        layout = transposed(block_n, D, element_bytes)
    else:  # row-major; v2_padded's rows are D_PAD wide, and the zero columns are read too
        layout = row_major(block_n, width, element_bytes)
    access = max(WORD_BYTES, element_bytes)
    return sum(column_read(layout, d, first, access).wavefronts
               for d in range(0, width, access // element_bytes) for first in range(0, block_n, WARP_SIZE))
