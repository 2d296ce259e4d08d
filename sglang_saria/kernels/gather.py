"""Triton-assisted mixed-source gather (Saria coordinated reload, FA + GDN in one launch).

A reload plan mixes objects from two places: rows that the storage engine read from SSD
into a *staging buffer*, and slots of the *host pool* (DRAM). Copying each group with its
own `index_copy_`/`transfer_kv_*` call costs one launch per (source, destination, layer);
this module moves all of them with ONE kernel launch, whatever the row widths.

Descriptor design: the plan is a list of byte segments
``(src_id, src_offset, dst_id, dst_offset, nbytes)`` into ``sources[src_id]`` and
``destinations[dst_id]``. A segment is a row: an FA token row of one layer's K or V
buffer, or one GDN checkpoint part (the conv state or the recurrent state of one layer).
Widths may differ from segment to segment, and so may dtypes (bf16 conv state next to an
fp32 recurrent state): the kernel moves raw integer words, so a copy is bit-exact by
construction. Long segments (a GDN recurrent state is MiBs) are split into chunks of at
most ``max_segment_bytes`` (one program each), so no program serialises a whole state.

Shapes (what the SGLang adapter passes; any tensor whose dim-0 slices are dense works,
including strided per-layer views of a staging buffer):

- FA, ``MHATokenToKVPool``: ``k_buffer[l]`` / ``v_buffer[l]`` are ``[size + page_size,
  head_num, head_dim]``; a row is one token slot of one layer (``head_num * head_dim``
  elements). A staging buffer of SSD rows ``[n, layer_num, 2, head_num, head_dim]`` is
  passed as the views ``staging[:, l, 0]`` and ``staging[:, l, 1]`` (no copy).
  Host pool (``MHATokenToKVPoolHost.kv_buffer``): layer_first ``[2, layer_num, size,
  head_num, head_dim]`` is passed as ``kv_buffer[0, l]`` / ``kv_buffer[1, l]``;
  page_first ``[2, size, layer_num, head_num, head_dim]`` as ``kv_buffer[0][:, l]``
  (strided rows); page_first_direct ``[2, pages, layer_num, page_size, head_num,
  head_dim]`` moves whole pages: ``kv_buffer[0][:, l]`` against the device view
  ``k_buffer[l].view(-1, page_size, head_num, head_dim)`` (rows = pages).
- GDN/Mamba, ``MambaPool``: ``conv_state[i]`` is ``[num_mamba_layers, size + 1,
  *conv_shape]`` and ``temporal_state`` ``[num_mamba_layers, size + 1, HV, V, K]``; a row
  is one slot of one layer, passed as ``conv_state[i][l]`` / ``temporal_state[l]``.
  Checkpoint rows in a staging buffer are views of the same row widths and dtypes.

Backends: ``"triton"`` runs :func:`_gather_mixed_kernel` (compiled on CUDA tensors; on CPU
tensors only when ``TRITON_INTERPRET=1`` was set before triton was imported),
``"torch"`` runs :func:`gather_mixed_reference`. ``"auto"`` picks the compiled kernel
for CUDA destinations, the interpreted kernel for CPU destinations under
``TRITON_INTERPRET=1``, and torch otherwise. On CUDA the sources may be
pinned host tensors (SGLang's host pool): the kernel reads them over UVA, so DRAM and
staging rows still go in one launch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton use the torch reference
    triton = None
    tl = None

logger = logging.getLogger(__name__)

Backend = Literal["auto", "triton", "torch"]

# Columns of GatherPlan.segments.
SRC_ID, SRC_OFFSET, DST_ID, DST_OFFSET, NBYTES = range(5)
_SEGMENT_COLUMNS = ("src_id", "src_offset", "dst_id", "dst_offset", "nbytes")

# Largest word the kernel moves; tl has no 16-byte integer type.
_MAX_WORD_BYTES = 8
_WORD_TORCH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
DEFAULT_MAX_SEGMENT_BYTES = 64 * 1024
_MAX_BLOCK_WORDS = 1024


@dataclass(frozen=True)
class RowMoves:
    """Rows ``src_rows`` of ``sources[src]`` go to rows ``dst_rows`` of ``destinations[dst]``.

    One group per (source tensor, destination tensor) pair: e.g. the SSD rows of layer 3's
    K buffer, or the DRAM slots of layer 0's conv state. Row indices index dim 0.
    """

    src: int
    src_rows: torch.Tensor | Sequence[int]
    dst: int
    dst_rows: torch.Tensor | Sequence[int]


@dataclass(frozen=True)
class RowLayout:
    """Geometry of a row-addressable tensor: ``rows`` dense rows of ``row_bytes``, ``row_stride_bytes`` apart."""

    rows: int
    row_bytes: int
    row_stride_bytes: int
    dtype: torch.dtype

    @property
    def extent_bytes(self) -> int:
        """Bytes from the first element of row 0 to the end of the last row."""
        return 0 if self.rows == 0 else (self.rows - 1) * self.row_stride_bytes + self.row_bytes

    @classmethod
    def of(cls, tensor: torch.Tensor, name: str) -> RowLayout:
        """Validate that ``tensor``'s dim-0 slices are dense and non-overlapping; a gather moves whole rows."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() == 0:
            raise ValueError(f"{name}: a 0-dim tensor has no rows")
        row_elems = 1
        for size, stride in zip(reversed(tensor.shape[1:]), reversed(tensor.stride()[1:])):
            if size != 1 and stride != row_elems:
                raise ValueError(f"{name}: rows must be dense (shape {tuple(tensor.shape)}, strides {tensor.stride()})")
            row_elems *= size
        rows = tensor.shape[0]
        if rows > 1 and tensor.stride(0) < row_elems:
            raise ValueError(
                f"{name}: rows overlap (dim-0 stride {tensor.stride(0)} < {row_elems} elements per row)"
            )
        item = tensor.element_size()
        return cls(rows, row_elems * item, tensor.stride(0) * item, tensor.dtype)


def _as_index(values: torch.Tensor | Sequence[int], name: str) -> torch.Tensor:
    index = torch.as_tensor(values)
    if index.numel() == 0 and index.dim() == 1:
        return torch.zeros(0, dtype=torch.int64)  # `[]` arrives as float32
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise TypeError(f"{name}: row indices must be integers, got {index.dtype}")
    if index.dim() != 1:
        raise ValueError(f"{name}: row indices must be 1-D, got shape {tuple(index.shape)}")
    return index.to(device="cpu", dtype=torch.int64)


def _pow2_alignment(values: torch.Tensor, cap: int) -> int:
    """Largest power of two <= cap that divides every value (cap when there are none)."""
    word = cap
    while word > 1 and values.numel() and bool((values % word != 0).any()):
        word //= 2
    return word


def _check_range(values: torch.Tensor, low: int, high: int, name: str) -> None:
    """Raise naming the first value outside [low, high)."""
    bad = (values < low) | (values >= high)
    if bool(bad.any()):
        pos = int(bad.nonzero()[0, 0])
        raise IndexError(f"{name}[{pos}] = {int(values[pos])} is out of range [{low}, {high})")


@dataclass(frozen=True)
class GatherPlan:
    """Byte segments of one mixed-source reload, validated once and reusable across launches.

    ``segments`` is an int64 ``[n, 5]`` CPU tensor with columns
    ``src_id, src_offset, dst_id, dst_offset, nbytes`` (offsets in bytes from the first
    element of the bound tensor). ``alignment`` is the largest power of two (<= 8) that
    divides every offset and length: the kernel's word size when the bound tensors'
    addresses allow it. Plans from :meth:`from_rows` remember each tensor's row layout
    and refuse tensors of another geometry at launch.
    """

    segments: torch.Tensor
    num_sources: int
    num_destinations: int
    alignment: int
    src_extent_bytes: tuple[int, ...]
    dst_extent_bytes: tuple[int, ...]
    src_layouts: tuple[RowLayout, ...] | None = None
    dst_layouts: tuple[RowLayout, ...] | None = None
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_segments(self) -> int:
        return self.segments.shape[0]

    @property
    def total_bytes(self) -> int:
        return int(self.segments[:, NBYTES].sum())

    @classmethod
    def from_segments(
        cls,
        src_id: torch.Tensor | Sequence[int],
        src_offset: torch.Tensor | Sequence[int],
        dst_id: torch.Tensor | Sequence[int],
        dst_offset: torch.Tensor | Sequence[int],
        nbytes: torch.Tensor | Sequence[int],
        num_sources: int,
        num_destinations: int,
        max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES,
    ) -> GatherPlan:
        """Build a plan from byte segments (what a storage engine that knows byte offsets emits)."""
        if max_segment_bytes <= 0 or max_segment_bytes % _MAX_WORD_BYTES:
            raise ValueError(f"max_segment_bytes = {max_segment_bytes} must be a positive multiple of {_MAX_WORD_BYTES}")
        columns = [_as_index(v, n) for v, n in zip((src_id, src_offset, dst_id, dst_offset, nbytes), _SEGMENT_COLUMNS)]
        lengths = {c.numel() for c in columns}
        if len(lengths) != 1:
            raise ValueError(f"segment columns {_SEGMENT_COLUMNS} differ in length: {[c.numel() for c in columns]}")
        seg = torch.stack(columns, dim=1) if columns[0].numel() else torch.zeros((0, 5), dtype=torch.int64)
        _check_range(seg[:, SRC_ID], 0, num_sources, "src_id")
        _check_range(seg[:, DST_ID], 0, num_destinations, "dst_id")
        for col in (SRC_OFFSET, DST_OFFSET):
            _check_range(seg[:, col], 0, 2**62, _SEGMENT_COLUMNS[col])
        _check_range(seg[:, NBYTES], 1, 2**62, "nbytes")
        _check_no_overlapping_writes(seg)
        seg = _split_long_segments(seg, max_segment_bytes)
        return cls(
            segments=seg,
            num_sources=num_sources,
            num_destinations=num_destinations,
            alignment=_pow2_alignment(seg[:, [SRC_OFFSET, DST_OFFSET, NBYTES]].reshape(-1), _MAX_WORD_BYTES),
            src_extent_bytes=_extents(seg[:, SRC_ID], seg[:, SRC_OFFSET] + seg[:, NBYTES], num_sources),
            dst_extent_bytes=_extents(seg[:, DST_ID], seg[:, DST_OFFSET] + seg[:, NBYTES], num_destinations),
        )

    @classmethod
    def from_rows(
        cls,
        sources: Sequence[torch.Tensor],
        destinations: Sequence[torch.Tensor],
        moves: Sequence[RowMoves],
        max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES,
    ) -> GatherPlan:
        """Build a plan from row moves; rows must agree in dtype and width, indices must be in range."""
        src_layouts = tuple(RowLayout.of(t, f"sources[{i}]") for i, t in enumerate(sources))
        dst_layouts = tuple(RowLayout.of(t, f"destinations[{i}]") for i, t in enumerate(destinations))
        columns: list[list[torch.Tensor]] = [[] for _ in range(5)]
        for g, move in enumerate(moves):
            name = f"moves[{g}]"
            if not 0 <= move.src < len(sources):
                raise IndexError(f"{name}.src = {move.src} is out of range [0, {len(sources)})")
            if not 0 <= move.dst < len(destinations):
                raise IndexError(f"{name}.dst = {move.dst} is out of range [0, {len(destinations)})")
            src, dst = src_layouts[move.src], dst_layouts[move.dst]
            if src.dtype != dst.dtype:
                raise TypeError(f"{name}: sources[{move.src}] is {src.dtype} but destinations[{move.dst}] is {dst.dtype}")
            if src.row_bytes != dst.row_bytes:
                raise ValueError(
                    f"{name}: rows of sources[{move.src}] are {src.row_bytes} bytes, "
                    f"rows of destinations[{move.dst}] are {dst.row_bytes} bytes"
                )
            src_rows = _as_index(move.src_rows, f"{name}.src_rows")
            dst_rows = _as_index(move.dst_rows, f"{name}.dst_rows")
            if src_rows.numel() != dst_rows.numel():
                raise ValueError(f"{name}: {src_rows.numel()} src_rows vs {dst_rows.numel()} dst_rows")
            _check_range(src_rows, 0, src.rows, f"{name}.src_rows")
            _check_range(dst_rows, 0, dst.rows, f"{name}.dst_rows")
            n = src_rows.numel()
            for col, values in enumerate(
                (
                    torch.full((n,), move.src, dtype=torch.int64),
                    src_rows * src.row_stride_bytes,
                    torch.full((n,), move.dst, dtype=torch.int64),
                    dst_rows * dst.row_stride_bytes,
                    torch.full((n,), src.row_bytes, dtype=torch.int64),
                )
            ):
                columns[col].append(values)
        empty = torch.zeros(0, dtype=torch.int64)
        plan = cls.from_segments(
            *(torch.cat(c) if c else empty for c in columns),
            num_sources=len(sources),
            num_destinations=len(destinations),
            max_segment_bytes=max_segment_bytes,
        )
        return replace(plan, src_layouts=src_layouts, dst_layouts=dst_layouts)

    def _device_segments(self, device: torch.device, word: int) -> torch.Tensor:
        """Segments in words on ``device``, uploaded once per (device, word)."""
        key = ("segments", str(device), word)
        if key not in self._cache:
            words = self.segments.clone()
            words[:, [SRC_OFFSET, DST_OFFSET, NBYTES]] //= word
            self._cache[key] = words.to(device)
        return self._cache[key]

    def _address_tables(
        self, device: torch.device, sources: Sequence[torch.Tensor], destinations: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Base addresses of the bound tensors on ``device``; re-uploaded only when they change."""
        key = (str(device), tuple(t.data_ptr() for t in sources), tuple(t.data_ptr() for t in destinations))
        cached = self._cache.get("tables")
        if cached is None or cached[0] != key:
            tables = tuple(torch.tensor(ptrs, dtype=torch.int64).to(device) for ptrs in key[1:])
            self._cache["tables"] = cached = (key, tables)
        return cached[1]

    def _copy_groups(self, word: int) -> list[_CopyGroup]:
        """Segments grouped by (src, dst, width) with their window steps, computed once per word size."""
        key = ("groups", word)
        if key not in self._cache:
            self._cache[key] = _group_segments(self.segments, self.num_destinations, word)
        return self._cache[key]


def _extents(ids: torch.Tensor, ends: torch.Tensor, count: int) -> tuple[int, ...]:
    out = torch.zeros(count, dtype=torch.int64)
    if ids.numel():
        out.scatter_reduce_(0, ids, ends, reduce="amax")
    return tuple(int(v) for v in out)


def _check_no_overlapping_writes(seg: torch.Tensor) -> None:
    """Two segments writing the same destination bytes would race in the kernel: refuse the plan."""
    if seg.shape[0] < 2:
        return
    order = torch.argsort(seg[:, DST_OFFSET], stable=True)
    order = order[torch.argsort(seg[order, DST_ID], stable=True)]  # by (dst_id, dst_offset)
    s = seg[order]
    same = s[1:, DST_ID] == s[:-1, DST_ID]
    clash = same & (s[1:, DST_OFFSET] < s[:-1, DST_OFFSET] + s[:-1, NBYTES])
    if bool(clash.any()):
        i = int(clash.nonzero()[0, 0])
        a, b = int(order[i]), int(order[i + 1])
        raise ValueError(
            f"segments {a} and {b} both write destinations[{int(s[i, DST_ID])}] "
            f"at byte {int(s[i + 1, DST_OFFSET])}: a destination row may be written once per plan"
        )


def _split_long_segments(seg: torch.Tensor, max_bytes: int) -> torch.Tensor:
    """Split segments longer than ``max_bytes`` into consecutive chunks (one program each)."""
    if seg.shape[0] == 0 or int(seg[:, NBYTES].max()) <= max_bytes:
        return seg
    pieces = (seg[:, NBYTES] + max_bytes - 1) // max_bytes
    parent = torch.repeat_interleave(torch.arange(seg.shape[0]), pieces)
    first = torch.cumsum(pieces, 0) - pieces
    skip = (torch.arange(parent.numel()) - first[parent]) * max_bytes
    out = seg[parent].clone()
    out[:, SRC_OFFSET] += skip
    out[:, DST_OFFSET] += skip
    out[:, NBYTES] = torch.clamp(out[:, NBYTES] - skip, max=max_bytes)
    return out


def _bind(
    plan: GatherPlan, sources: Sequence[torch.Tensor], destinations: Sequence[torch.Tensor]
) -> tuple[list[RowLayout], list[RowLayout]]:
    """Check that the tensors match the plan (count, geometry, size) before any byte moves."""
    bound: list[list[RowLayout]] = []
    for role, tensors, count, extents, expected in (
        ("sources", sources, plan.num_sources, plan.src_extent_bytes, plan.src_layouts),
        ("destinations", destinations, plan.num_destinations, plan.dst_extent_bytes, plan.dst_layouts),
    ):
        if len(tensors) != count:
            raise ValueError(f"plan expects {count} {role}, got {len(tensors)}")
        layouts = [RowLayout.of(t, f"{role}[{i}]") for i, t in enumerate(tensors)]
        bound.append(layouts)
        for i, layout in enumerate(layouts):
            if expected is not None and (layout.row_bytes, layout.row_stride_bytes) != (
                expected[i].row_bytes,
                expected[i].row_stride_bytes,
            ):
                raise ValueError(f"{role}[{i}]: row layout {layout} differs from the plan's {expected[i]}")
            if layout.extent_bytes < extents[i]:
                raise IndexError(f"{role}[{i}]: plan reaches byte {extents[i]} but the tensor spans {layout.extent_bytes}")
    return bound[0], bound[1]


def _word_bytes(plan: GatherPlan, tensors: Sequence[torch.Tensor]) -> int:
    """Widest word that divides the plan's offsets and every bound tensor's address."""
    addresses = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
    return _pow2_alignment(addresses, plan.alignment)


def _flat_words(tensor: torch.Tensor, layout: RowLayout, word: int) -> torch.Tensor:
    """1-D word view over the tensor's rows (and the gaps between strided rows)."""
    elems = layout.extent_bytes // tensor.element_size()
    flat = tensor.as_strided((elems,), (1,)).view(torch.uint8)
    return flat[: flat.numel() // word * word].view(_WORD_TORCH[word])


def _gcd_all(values: torch.Tensor) -> int:
    """gcd of all values (0 for none or all zeros), by pairwise halving."""
    while values.numel() > 1:
        if values.numel() % 2:
            values = torch.cat([values, values[-1:]])
        values = torch.gcd(values[0::2], values[1::2])
    return int(values[0]) if values.numel() else 0


@dataclass(frozen=True)
class _CopyGroup:
    """Segments of one (src, dst, width): rows of ``length``-word windows spaced ``step`` words apart."""

    src_id: int
    dst_id: int
    length: int
    src_step: int
    src_rows: torch.Tensor
    dst_step: int
    dst_rows: torch.Tensor


def _group_segments(seg: torch.Tensor, num_destinations: int, word: int) -> list[_CopyGroup]:
    """Rows of a row-major tensor start at multiples of its row stride, so the windows are usually
    its rows and each group becomes one row gather plus one row scatter, not a per-word copy."""
    widest = int(seg[:, NBYTES].max()) + 1
    key = (seg[:, SRC_ID] * num_destinations + seg[:, DST_ID]) * widest + seg[:, NBYTES]
    sorted_key, order = torch.sort(key, stable=True)
    _, counts = torch.unique_consecutive(sorted_key, return_counts=True)
    groups = []
    for rows in torch.split(seg[order], counts.tolist()):
        length = int(rows[0, NBYTES]) // word
        src_words, dst_words = rows[:, SRC_OFFSET] // word, rows[:, DST_OFFSET] // word
        src_step = _gcd_all(src_words) or length
        dst_step = _gcd_all(dst_words) or length
        if dst_step < length:  # windows would overlap: writing through them needs word granularity
            dst_step, dst_words = 1, dst_words[:, None] + torch.arange(length)
        groups.append(
            _CopyGroup(
                int(rows[0, SRC_ID]), int(rows[0, DST_ID]), length, src_step, src_words // src_step, dst_step, dst_words // dst_step
            )
        )
    return groups


def _windows(flat: torch.Tensor, step: int, length: int) -> torch.Tensor:
    """``flat`` as ``length``-word windows starting every ``step`` words (overlapping if step < length)."""
    return flat.as_strided(((flat.numel() - length) // step + 1, length), (step, 1))


def gather_mixed_reference(
    plan: GatherPlan, sources: Sequence[torch.Tensor], destinations: Sequence[torch.Tensor]
) -> None:
    """Pure-torch execution of ``plan``: one row gather + row scatter per (src, dst, width) group.

    The CPU path when Triton is absent, and the oracle the kernel is checked against.
    Sources on another device (pinned host pool -> CUDA pool) are copied over with ``.to``.
    """
    src_layouts, dst_layouts = _bind(plan, sources, destinations)
    if plan.num_segments == 0:
        return
    word = _word_bytes(plan, [*sources, *destinations])
    for g in plan._copy_groups(word):
        src, dst = sources[g.src_id], destinations[g.dst_id]
        src_view = _windows(_flat_words(src, src_layouts[g.src_id], word), g.src_step, g.length)
        moved = src_view[g.src_rows.to(src.device)].to(dst.device)
        dst_flat = _flat_words(dst, dst_layouts[g.dst_id], word)
        if g.dst_rows.dim() == 1:
            _windows(dst_flat, g.dst_step, g.length)[g.dst_rows.to(dst.device)] = moved
        else:
            dst_flat[g.dst_rows.to(dst.device)] = moved


if triton is not None:

    @triton.jit
    def _gather_mixed_kernel(segments_ptr, src_table_ptr, dst_table_ptr, WORD: tl.constexpr, BLOCK: tl.constexpr):
        """One program per segment: load its descriptor, resolve both base addresses, copy its words."""
        seg = segments_ptr + tl.program_id(0).to(tl.int64) * 5
        src_id = tl.load(seg + 0)
        src_offset = tl.load(seg + 1)
        dst_id = tl.load(seg + 2)
        dst_offset = tl.load(seg + 3)
        n = tl.load(seg + 4)
        src = tl.load(src_table_ptr + src_id).to(tl.pointer_type(WORD)) + src_offset
        dst = tl.load(dst_table_ptr + dst_id).to(tl.pointer_type(WORD)) + dst_offset
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def triton_interpreted() -> bool:
    """True when the kernel was defined under TRITON_INTERPRET=1 (runs on CPU tensors)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_gather_mixed_kernel, InterpretedFunction)


def select_backend(destinations: Sequence[torch.Tensor]) -> Literal["triton", "torch"]:
    """``auto`` policy: the kernel where it can run (CUDA, or CPU under the interpreter), else torch."""
    if triton is None:
        return "torch"
    on_cuda = any(t.is_cuda for t in destinations)
    interpreted = triton_interpreted()
    # The interpreter dereferences host addresses only: CUDA pools under it take the torch path.
    return "triton" if on_cuda != interpreted else "torch"


def _check_devices(sources: Sequence[torch.Tensor], destinations: Sequence[torch.Tensor]) -> torch.device:
    """Kernel launches need one destination device and sources it can address."""
    devices = {t.device for t in destinations}
    if len(devices) > 1:
        raise ValueError(f"destinations span several devices: {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type == "cuda":
        if triton_interpreted():
            raise RuntimeError("TRITON_INTERPRET=1 is set: the interpreted kernel cannot address CUDA memory")
        for i, t in enumerate(sources):
            if t.device != device and not (t.device.type == "cpu" and t.is_pinned()):
                raise ValueError(f"sources[{i}] is on {t.device}: the kernel on {device} reads only {device} or pinned host memory")
    elif device.type == "cpu":
        if not triton_interpreted():
            raise RuntimeError("the Triton gather on CPU tensors needs TRITON_INTERPRET=1 set before importing triton")
        for i, t in enumerate(sources):
            if t.device.type != "cpu":
                raise ValueError(f"sources[{i}] is on {t.device} but the destinations are on the CPU")
    else:
        raise ValueError(f"the Triton gather supports cuda and (interpreted) cpu destinations, not {device}")
    return device


def _gather_mixed_triton(
    plan: GatherPlan, sources: Sequence[torch.Tensor], destinations: Sequence[torch.Tensor]
) -> None:
    if triton is None:
        raise RuntimeError("backend='triton' requested but triton is not installed")
    _bind(plan, sources, destinations)
    if plan.num_segments == 0:
        return
    device = _check_devices(sources, destinations)
    word = _word_bytes(plan, [*sources, *destinations])
    segments = plan._device_segments(device, word)
    src_table, dst_table = plan._address_tables(device, sources, destinations)
    longest = int(plan.segments[:, NBYTES].max()) // word
    block = min(_MAX_BLOCK_WORDS, max(16, triton.next_power_of_2(longest)))
    word_type = {1: tl.uint8, 2: tl.int16, 4: tl.int32, 8: tl.int64}[word]
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        _gather_mixed_kernel[(plan.num_segments,)](segments, src_table, dst_table, WORD=word_type, BLOCK=block)


def gather_mixed(
    plan: GatherPlan,
    sources: Sequence[torch.Tensor],
    destinations: Sequence[torch.Tensor],
    backend: Backend = "auto",
) -> Literal["triton", "torch"]:
    """Execute ``plan``: copy every segment from ``sources`` into ``destinations``; returns the backend used.

    The launch is asynchronous on CUDA (current stream), like SGLang's own KV copies.
    """
    chosen = select_backend(destinations) if backend == "auto" else backend
    if chosen == "triton":
        _gather_mixed_triton(plan, sources, destinations)
    elif chosen == "torch":
        gather_mixed_reference(plan, sources, destinations)
    else:
        raise ValueError(f"backend = {backend!r}; expected 'auto', 'triton' or 'torch'")
    logger.debug("gather_mixed: %d segments, %d bytes via %s", plan.num_segments, plan.total_bytes, chosen)
    return chosen


def gather_rows(
    sources: Sequence[torch.Tensor],
    destinations: Sequence[torch.Tensor],
    moves: Sequence[RowMoves],
    backend: Backend = "auto",
) -> Literal["triton", "torch"]:
    """Execute row moves once: the kernel (one launch, via a :class:`GatherPlan`) where it
    runs, else one indexed row copy per move, which skips building byte segments that a
    one-off torch launch would not reuse. Same rows land either way (tests check both)."""
    chosen = select_backend(destinations) if backend == "auto" else backend
    if chosen == "triton":
        _gather_mixed_triton(GatherPlan.from_rows(sources, destinations, moves), sources, destinations)
        return chosen
    if chosen != "torch":
        raise ValueError(f"backend = {backend!r}; expected 'auto', 'triton' or 'torch'")
    for move in moves:
        dst = destinations[move.dst]
        rows = sources[move.src][_as_index(move.src_rows, "src_rows").to(sources[move.src].device)]
        dst[_as_index(move.dst_rows, "dst_rows").to(dst.device)] = rows.to(dst.device)
    return chosen


__all__ = [
    "DEFAULT_MAX_SEGMENT_BYTES",
    "GatherPlan",
    "RowLayout",
    "RowMoves",
    "gather_mixed",
    "gather_mixed_reference",
    "gather_rows",
    "select_backend",
    "triton_interpreted",
]
