"""Direct SSD -> device-pool reload (paper 4.3, 4.5, 5.1): no host-pool staging.

A reload plan has DRAM pages (in SGLang's host pool) and SSD pages (in the store). SSD
pages are read into a staging buffer on the KV pool's own device (kvikio/GDS when the pool
is on a GPU, POSIX reads on CPU); then ONE mixed-source gather
(`sglang_saria.kernels.gather`, the Triton kernel on GPU, reading pinned host memory over
UVA) moves the staged rows and the plan's host-pool rows into the request's device slots.
SSD pages never pass through the host pool, so an SSD hit costs no DRAM capacity and no
second copy. The pages move in chunks; a pacer says how much of the DRAM part goes with
each chunk, so a coordinated reload spreads DRAM copies over the SSD reads (paper 4.5).

Staging is two chunks (a double buffer: the next chunk reads while this one is gathered),
allocated once when the reloader is built, so a reload allocates no device memory and
cannot run out of it mid-flight. Its size (`staging_bytes`, and a hybrid model's checkpoint
page) is reserved out of SGLang's KV budget when the pool is sized
(`sglang_saria/hicache/direct_reload/staging.py`, plugin hook on `config_from_budget`).
Loads are serialised on the reloader (one staging buffer pair); the reload worker runs one
job at a time anyway.

Integrity: on a GPU a page is checked where it landed. The store reads it with its host
xxh3 check off (that check copies the page to host memory) and the reloader recomputes the
page's device digest (`kernels/checksum.py`, recorded by the store at write time) over the
chunk's staged pages, one kernel launch per chunk; only one boolean per page crosses to
the host. A mismatch is a "corrupt" read of that page, exactly like a failed host check:
the pages before it land, the rest of the load stops. On CPU the store's host check stays.

A stored page has the byte order of SGLang's host pool page (`get_data_page(flat=True)`),
since HiCache's host->storage backup wrote it: `page_first` is token-major
`[K|V][token][layer]`, `layer_first` and `page_first_direct` are layer-major
`[K|V][layer][token]`; each innermost row is one token of one layer
(`head_num * head_dim` elements), the row width of the device pool's `k_buffer[l]`.
Host-pool rows are token rows (`page_first`, `layer_first`) or whole pages
(`page_first_direct`, which keeps a page's tokens of one layer together).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import wait
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import torch

from sglang_saria.digest import as_int64
from sglang_saria.kernels.checksum import kernel_runs_on, row_digests
from sglang_saria.kernels.gather import RowMoves, gather_rows
from sglang_saria.reload.gdn_state import StateRows, staging_page
from sglang_saria.storage.store import GetStatus

logger = logging.getLogger(__name__)

# Host-pool layouts whose pages are [K|V] x (token, layer) rows, and their row order.
TOKEN_MAJOR_LAYOUTS = frozenset({"page_first"})
LAYER_MAJOR_LAYOUTS = frozenset({"layer_first", "page_first_direct"})
SUPPORTED_LAYOUTS = TOKEN_MAJOR_LAYOUTS | LAYER_MAJOR_LAYOUTS
DEFAULT_CHUNK_PAGES = 16  # pages per read + gather step (and per pacing step)
STAGING_BUFFERS = 2  # double buffer: one chunk reads while the other is gathered

# Where a read is verified: "host" (the store's xxh3, the page copied to host memory when it
# sits on a GPU), "device" (the page's digest recomputed in the staging buffer), "auto"
# (device when the staging is on a GPU, the digest kernel runs there and digests are known).
Verify = Literal["auto", "host", "device"]


def staging_bytes(chunk_pages: int, page_bytes: int) -> int:
    """Bytes of staging a reloader of ``chunk_pages`` pages per step holds for its life."""
    return STAGING_BUFFERS * chunk_pages * page_bytes


class UnsupportedPoolLayout(ValueError):
    """The device or host pool has a layout the direct path cannot address row by row."""


@dataclass(frozen=True)
class PageGeometry:
    """Where row (kv, token, layer) of stored page n sits in a staging buffer of such pages."""

    layers: int
    page_size: int
    token_major: bool

    @property
    def rows_per_page(self) -> int:
        return 2 * self.page_size * self.layers

    def staging_rows(self, n_pages: int, kv: int, layer: int) -> torch.Tensor:
        """Staging rows of (kv, layer) for every token of ``n_pages`` pages, in slot order."""
        page = torch.arange(n_pages, dtype=torch.int64)[:, None]
        token = torch.arange(self.page_size, dtype=torch.int64)[None, :]
        if self.token_major:
            rows = ((page * 2 + kv) * self.page_size + token) * self.layers + layer
        else:
            rows = ((page * 2 + kv) * self.layers + layer) * self.page_size + token
        return rows.reshape(-1)


@dataclass(frozen=True)
class StateLoad:
    """A hybrid plan's GDN checkpoint: into device mamba ``slot``, from the store's sidecar
    of page ``key`` (SSD) or from host pool slot ``host_slot`` (DRAM)."""

    slot: int
    key: Optional[str] = None
    host_slot: Optional[int] = None

    def __post_init__(self) -> None:
        if (self.key is None) == (self.host_slot is None):
            raise ValueError(f"a checkpoint comes from the store (key) or the host pool (host_slot), got {self}")


@dataclass
class ReloadOutcome:
    ok: bool
    pages: int = 0  # leading SSD pages now in their device slots (all of them when ok)
    nbytes: int = 0
    reason: str = ""  # why it failed: the store's status ("miss", "corrupt", "io_error", ...) or "stopped"
    failed: list[tuple[str, str]] = field(default_factory=list)  # (page hash, status) of failed reads
    state_loaded: bool = False  # the plan's checkpoint is in its device slot (gathered with the last chunk)
    state_failed: str = ""  # the store's status of a checkpoint read that failed ("" if none did)
    host_pages: int = 0  # DRAM pages moved (all of the plan's, whenever the load ran to its end or stopped)


def fa_pool_of(device_pool: Any) -> Any:
    """The pool holding a model's full-attention K/V buffers: the pool itself, or a hybrid
    pool's ``full_kv_pool``. Its ``k_buffer[i]`` is the i-th full-attention layer in model
    order (SGLang's ``full_attention_layer_id_mapping``: model layer id -> i), the order the
    host pool's and so the stored pages' layers have; a mapping that is not that order is
    refused rather than gathered into the wrong layers."""
    inner = getattr(device_pool, "full_kv_pool", None)
    if inner is None:
        return device_pool
    mapping = getattr(device_pool, "full_attention_layer_id_mapping", None) or {}
    ids = sorted(mapping)
    if [mapping[i] for i in ids] != list(range(len(ids))):
        raise UnsupportedPoolLayout(f"full-attention layer mapping {mapping} is not in model layer order")
    return inner


def kv_buffers(device_pool: Any, host_layout: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The per-layer K and V buffers of the pool holding the full-attention layers
    (`fa_pool_of`); `UnsupportedPoolLayout` unless they are ``[slots, head_num, head_dim]``
    tensors of one shape and the host layout's pages are rows of that shape."""
    device_pool = fa_pool_of(device_pool)
    k_bufs = getattr(device_pool, "k_buffer", None)
    v_bufs = getattr(device_pool, "v_buffer", None)
    if not isinstance(k_bufs, list) or not isinstance(v_bufs, list) or not k_bufs:
        raise UnsupportedPoolLayout(
            f"device pool {type(device_pool).__name__} has no per-layer k_buffer/v_buffer lists"
        )
    if host_layout not in SUPPORTED_LAYOUTS:
        raise UnsupportedPoolLayout(
            f"--hicache-mem-layout {host_layout}: direct reload supports {sorted(SUPPORTED_LAYOUTS)}"
        )
    shapes = {tuple(t.shape[1:]) for t in k_bufs + v_bufs}
    if any(t.dim() != 3 for t in k_bufs + v_bufs) or len(shapes) != 1:
        raise UnsupportedPoolLayout(
            "direct reload needs [slots, head_num, head_dim] K and V buffers of one shape; "
            f"got {sorted({tuple(t.shape) for t in k_bufs + v_bufs})}"
        )
    return k_bufs, v_bufs


@dataclass
class _Load:
    """One `DeviceReloader.load` on its way through the chunks."""

    page_hashes: Sequence[str]
    slot_rows: torch.Tensor  # [pages, page_size] device slots of the SSD pages
    host_slots: torch.Tensor  # host-pool slots of the DRAM pages gathered with them
    host_dst: torch.Tensor  # their device slots
    chunk: int  # pages per step
    pace: Optional[Callable[[int], float]] = None
    stop: Optional[Callable[[], bool]] = None
    state: Optional[StateLoad] = None
    host_pages: int = 0  # DRAM pages of the load
    host_done: int = 0  # DRAM pages moved so far
    reads: list = field(default_factory=list)  # the store reads of the chunk in flight
    digests: list[Optional[int]] = field(default_factory=list)  # what to verify them against on the device
    state_read: Any = None  # the stored checkpoint's read (None: none, or from the host pool)
    state_loaded: bool = False

    @property
    def n(self) -> int:
        return len(self.page_hashes)


class DeviceReloader:
    """Moves a reload plan's SSD pages (store) and DRAM pages (host pool) into device slots."""

    def __init__(
        self,
        read_page: Callable[[str, torch.Tensor], Any],
        device_pool: Any,
        host_layout: str,
        page_size: int,
        page_bytes: int,
        host_pool: Any = None,
        chunk_pages: int = DEFAULT_CHUNK_PAGES,
        page_digest: Optional[Callable[[str], Optional[int]]] = None,
        verify: Verify = "auto",
        state_rows: Optional[StateRows] = None,
        read_state: Optional[Callable[..., Any]] = None,
    ) -> None:
        """``read_page(page_hash, dest, host_check=True)`` starts one store read and returns a
        concurrent Future of its status (`SariaStore.get_async`).

        ``host_pool``: SGLang's MHA host pool, to move DRAM pages in the same gathers
        (None, or a pool of another kind: DRAM pages are left to HiCache's own copy).
        ``page_digest(page_hash)``: the device digest the store recorded (`digest_of`), for
        ``verify="device"``; a page without one (stored before index format 2) keeps the
        store's host check. ``chunk_pages``: pages per step; the staging (two chunks) is
        allocated here, once.

        ``state_rows`` / ``read_state(page_hash, dest)``: a hybrid model's GDN checkpoints
        (`gdn_state.StateRows`) and the store read of a page's MAMBA sidecar; a plan's
        checkpoint then goes in the same gather as its last FA chunk (one page of state
        staging, allocated here too).
        """
        k_bufs, v_bufs = kv_buffers(device_pool, host_layout)
        self.geometry = PageGeometry(len(k_bufs), page_size, host_layout in TOKEN_MAJOR_LAYOUTS)
        self.row_shape = tuple(k_bufs[0].shape[1:])
        self.dtype = k_bufs[0].dtype
        self.device = k_bufs[0].device
        row_bytes = k_bufs[0][0].numel() * k_bufs[0].element_size()
        if self.geometry.rows_per_page * row_bytes != page_bytes:
            raise UnsupportedPoolLayout(
                f"a stored page is {page_bytes} bytes but 2 x {page_size} tokens x {len(k_bufs)} layers x "
                f"{row_bytes} bytes per row = {self.geometry.rows_per_page * row_bytes}"
            )
        self.page_bytes = page_bytes
        self.read_page = read_page
        if chunk_pages < 1:
            raise ValueError(f"chunk_pages={chunk_pages}: a reload step needs at least one page")
        self.chunk_pages = chunk_pages
        self.page_digest = page_digest
        self.verify = self._verify_mode(verify)
        self._staging = torch.empty(
            (STAGING_BUFFERS, chunk_pages * self.geometry.rows_per_page, *self.row_shape),
            dtype=self.dtype,
            device=self.device,
        )
        self.state_rows = state_rows
        self.read_state = read_state
        self._state_staging = staging_page(state_rows)
        self._lock = threading.Lock()
        self._gather_views(k_bufs + v_bufs, host_pool, host_layout)

    def _gather_views(self, kv_bufs: list[torch.Tensor], host_pool: Any, layout: str) -> None:
        """The gathers' destinations (token rows of every layer's K then V; page rows too for
        page_first_direct) and the host pool's rows as their sources."""
        page = self.geometry.page_size
        self.destinations = kv_bufs
        self._host_sources, self._host_page_rows = self._host_views(host_pool, layout, page)
        if self._host_page_rows:
            self.destinations = self.destinations + [t.view(-1, page, *self.row_shape) for t in kv_bufs]

    def _host_views(self, host_pool: Any, layout: str, page: int) -> tuple[list[torch.Tensor], bool]:
        """Per-(kv, layer) row views of the host pool's KV buffer, and whether rows are pages."""
        buf = getattr(host_pool, "kv_buffer", None)
        layers = self.geometry.layers
        if not isinstance(buf, torch.Tensor) or buf.dtype != self.dtype:
            return [], False
        if layout == "page_first" and buf.shape[2:] == (layers, *self.row_shape):
            return [buf[kv][:, l] for kv in (0, 1) for l in range(layers)], False
        if layout == "layer_first" and buf.shape[1] == layers and buf.shape[3:] == self.row_shape:
            return [buf[kv, l] for kv in (0, 1) for l in range(layers)], False
        if layout == "page_first_direct" and buf.shape[2:] == (layers, page, *self.row_shape):
            if all(t.shape[0] % page == 0 for t in self.destinations):
                return [buf[kv][:, l] for kv in (0, 1) for l in range(layers)], True
        return [], False

    def _verify_mode(self, verify: Verify) -> Literal["host", "device"]:
        if verify == "auto":
            on_device = self.device.type == "cuda" and kernel_runs_on("cuda")
            return "device" if on_device and self.page_digest is not None else "host"
        if verify == "device" and self.page_digest is None:
            raise ValueError("verify='device' needs page_digest (the digests the store recorded)")
        if verify not in ("host", "device"):
            raise ValueError(f"verify={verify!r}: expected 'auto', 'host' or 'device'")
        return verify

    @property
    def staging_bytes(self) -> int:
        """Bytes of FA page staging this reloader holds (allocated at construction, never per load)."""
        return self._staging.numel() * self._staging.element_size()

    @property
    def state_staging_bytes(self) -> int:
        """Bytes of GDN checkpoint staging (one sidecar page; 0 without state rows)."""
        return 0 if self._state_staging is None else self._state_staging.numel()

    def _device_mismatches(self, pages: torch.Tensor, expected: Sequence[Optional[int]]) -> list[int]:
        """Indices of staged pages whose digest differs from the recorded one: one digest
        kernel launch over all of them, one boolean per page back to the host. Pages without
        a recorded digest were checked by the store on the host and are skipped."""
        known = torch.tensor([d is not None for d in expected], dtype=torch.bool)
        if not known.any():
            return []
        want = torch.tensor([as_int64(d) if d is not None else 0 for d in expected], dtype=torch.int64)
        got = row_digests(pages)
        bad = (got != want.to(got.device)).cpu() & known
        return bad.nonzero().flatten().tolist()

    @property
    def moves_host_pages(self) -> bool:
        """DRAM pages of a plan can go in the same gathers as its SSD pages."""
        return bool(self._host_sources)

    def _host_moves(self, host_slots: torch.Tensor, device_slots: torch.Tensor) -> list[RowMoves]:
        g = self.geometry
        if self._host_page_rows:
            src, dst, dst_base = host_slots[:: g.page_size] // g.page_size, device_slots[:: g.page_size] // g.page_size, 2 * g.layers
        else:
            src, dst, dst_base = host_slots, device_slots, 0
        return [RowMoves(1 + i, src, dst_base + i, dst) for i in range(2 * g.layers)]

    def load(
        self,
        page_hashes: Sequence[str],
        slots: torch.Tensor,
        host_slots: Optional[torch.Tensor] = None,
        host_device_slots: Optional[torch.Tensor] = None,
        pace: Optional[Callable[[int], float]] = None,
        stop: Optional[Callable[[], bool]] = None,
        state: Optional[StateLoad] = None,
    ) -> ReloadOutcome:
        """Read ``page_hashes`` into token slots ``slots`` (``page_size`` per page) and copy
        host-pool slots ``host_slots`` to ``host_device_slots``, in one plan; with
        ``state`` (hybrid models), the plan's GDN checkpoint goes into its mamba slot in
        the gather of the last chunk, from the store (read with the first chunk) or the
        host pool, only if every page before it landed (`ReloadOutcome.state_loaded`).

        Pages move ``chunk_pages`` at a time through the reloader's staging (so a long
        prefix needs no prefix-sized buffer): read, verify (on the device, see the module
        docstring), then one gather of the chunk plus the DRAM pages due by then:
        ``pace(ssd_bytes_so_far)`` (it may sleep) returns the DRAM bytes due; without it the
        whole DRAM part goes with the first chunk. A failed read or digest stops the load
        before its page is scattered; the slots are fresh, so the caller just frees them.
        ``pages`` in the outcome counts SSD pages. Concurrent calls run one after another.
        """
        if state is not None and self.state_rows is None:
            raise ValueError("this reloader has no GDN state rows: a checkpoint needs state_rows")
        if state is not None and state.key is not None and self.read_state is None:
            raise ValueError("this reloader has no read_state: a stored checkpoint cannot be read")
        with self._lock:
            return self._run(self._begin(page_hashes, slots, host_slots, host_device_slots, pace, stop, state))

    def _read_chunk(self, page_hashes: Sequence[str], start: int, chunk: int) -> tuple[list, list[Optional[int]]]:
        """Start the reads of the chunk at ``start`` into its staging buffer; their futures and
        the digests to verify them against on the device (None: the store checks on the host)."""
        pages = self._staging[(start // chunk) % STAGING_BUFFERS, : chunk * self.geometry.rows_per_page].view(chunk, -1)
        futures, digests = [], []
        for i in range(min(chunk, len(page_hashes) - start)):
            key = page_hashes[start + i]
            want = self.page_digest(key) if self.verify == "device" else None
            digests.append(want)
            futures.append(self.read_page(key, pages[i], host_check=False) if want is not None else self.read_page(key, pages[i]))
        return futures, digests

    def _run(self, load: _Load) -> ReloadOutcome:
        """Every chunk of a begun load, in prefix order, until one ends it."""
        try:
            for start in range(0, max(load.n, 1), load.chunk):
                outcome = self._step(load, start)
                if outcome is not None:
                    return outcome
        finally:
            # A read still in flight (an exception above) must not land in staging a later load uses.
            wait(load.reads + ([load.state_read] if load.state_read is not None else []))
        self._sync()
        return ReloadOutcome(True, load.n, load.n * self.page_bytes, state_loaded=load.state_loaded, host_pages=load.host_done)

    def _begin(
        self,
        page_hashes: Sequence[str],
        slots: torch.Tensor,
        host_slots: Optional[torch.Tensor],
        host_device_slots: Optional[torch.Tensor],
        pace: Optional[Callable[[int], float]],
        stop: Optional[Callable[[], bool]],
        state: Optional[StateLoad],
    ) -> _Load:
        """A load's arguments checked, and its first chunk's (and a stored checkpoint's) reads started."""
        n = len(page_hashes)
        g = self.geometry
        if slots.numel() != n * g.page_size:
            raise ValueError(f"{n} pages need {n * g.page_size} slots, got {slots.numel()}")
        host_slots = torch.zeros(0, dtype=torch.int64) if host_slots is None else host_slots.to("cpu", torch.int64)
        host_dst = torch.zeros(0, dtype=torch.int64) if host_device_slots is None else host_device_slots.to("cpu", torch.int64)
        if host_slots.numel() != host_dst.numel() or host_slots.numel() % g.page_size:
            raise ValueError(f"{host_slots.numel()} host slots vs {host_dst.numel()} device slots (whole pages)")
        if host_slots.numel() and not self.moves_host_pages:
            raise ValueError("this reloader has no host-pool views: DRAM pages need HiCache's copy")
        load = _Load(
            page_hashes, slots.to("cpu", torch.int64).view(n, g.page_size), host_slots, host_dst,
            chunk=max(1, min(n, self.chunk_pages)), pace=pace, stop=stop, state=state,
            host_pages=host_slots.numel() // g.page_size,
        )
        if n:
            load.reads, load.digests = self._read_chunk(page_hashes, 0, load.chunk)
        load.state_read = self._read_state(state)
        return load

    def _step(self, load: _Load, start: int) -> Optional[ReloadOutcome]:
        """One chunk: its reads checked, the next chunk's started, then one gather of its pages,
        the DRAM pages due by now and, after the last page, the checkpoint. The outcome of a
        load that ends here unfinished (a failed read or checkpoint, a stop); None otherwise."""
        buf = self._staging[(start // load.chunk) % STAGING_BUFFERS]
        count, failed = self._landed(load, start, buf)
        end = start + count
        # Stopped or failed: gather what this chunk read in prefix order, read no further.
        last = bool(failed) or end >= load.n or (load.stop is not None and load.stop())
        if not last:
            self._read_ahead(load, start + load.chunk)
        due = self._dram_due(load, end, last)
        moves = self._page_moves(load, start, count) + self._host_page_moves(load, due)
        sources, destinations = [buf, *self._host_sources], self.destinations
        state_failed = ""
        if load.state is not None and end >= load.n and not failed:
            state_failed = self._state_failure(load)
            if not state_failed:
                sources, destinations, state_moves = self._with_state(sources, destinations, load.state)
                moves += state_moves
                load.state_loaded = True
        if moves:
            gather_rows(sources, destinations, moves)
        if (end < load.n and last) or state_failed:
            self._sync()
            reason = failed[0][1] if failed else (f"state_{state_failed}" if state_failed else "stopped")
            return ReloadOutcome(
                False, end, end * self.page_bytes, reason=reason, failed=failed, state_failed=state_failed,
                host_pages=load.host_done,
            )
        return None

    def _landed(self, load: _Load, start: int, buf: torch.Tensor) -> tuple[int, list[tuple[str, str]]]:
        """How many leading pages of the chunk at ``start`` read well, and the (page hash,
        status) of those that did not: the store's statuses, then (``verify="device"``) the
        staged pages' digests, a mismatch being a corrupt read."""
        statuses = [f.result() for f in load.reads]
        failed = [(load.page_hashes[start + i], st.value) for i, st in enumerate(statuses) if not st.ok]
        count = min(load.chunk, load.n - start)
        if failed:
            count = next(i for i, st in enumerate(statuses) if not st.ok)
        if self.verify == "device" and count:
            staged = buf[: count * self.geometry.rows_per_page].view(count, -1)
            corrupt = self._device_mismatches(staged, load.digests[:count])
            if corrupt:  # a bad digest is a corrupt read: pages before it land
                failed = [(load.page_hashes[start + i], GetStatus.CORRUPT.value) for i in corrupt] + failed
                count = corrupt[0]
        return count, failed

    def _read_ahead(self, load: _Load, start: int) -> None:
        """Double buffering: start the reads of the chunk at ``start`` while this one is gathered."""
        if self.device.type == "cuda":
            # The buffer about to be refilled was gathered from two chunks ago.
            torch.cuda.current_stream(self.device).synchronize()
        load.reads, load.digests = self._read_chunk(load.page_hashes, start, load.chunk)

    def _dram_due(self, load: _Load, landed: int, last: bool) -> int:
        """Pacing (paper 4.5): the DRAM pages due once ``landed`` SSD pages are in: all of them
        at the end, even of a load that stops unfinished (they come before its SSD pages, so
        they are published with whatever landed), else what ``pace`` allows."""
        done_bytes = landed * self.page_bytes
        if last and landed < load.n:
            return load.host_pages
        if load.pace is not None and landed < load.n:
            return min(load.host_pages, int(load.pace(done_bytes) // self.page_bytes))
        if load.pace is not None:
            load.pace(done_bytes)
        return load.host_pages

    def _page_moves(self, load: _Load, start: int, count: int) -> list[RowMoves]:
        """The staged rows of ``count`` pages from ``start`` into their slots, per (kv, layer)."""
        if not count:
            return []
        g = self.geometry
        dst_rows = load.slot_rows[start : start + count].reshape(-1)
        return [
            RowMoves(0, g.staging_rows(count, kv, layer), kv * g.layers + layer, dst_rows)
            for kv in (0, 1)
            for layer in range(g.layers)
        ]

    def _host_page_moves(self, load: _Load, due: int) -> list[RowMoves]:
        """The host-pool pages due and not yet moved (in the same gather as the SSD pages)."""
        if due <= load.host_done:
            return []
        span = slice(load.host_done * self.geometry.page_size, due * self.geometry.page_size)
        load.host_done = due
        return self._host_moves(load.host_slots[span], load.host_dst[span])

    def _state_failure(self, load: _Load) -> str:
        """The store's status of a stored checkpoint's failed read ("" when it is good, or comes from the host pool)."""
        status = load.state_read.result() if load.state_read is not None else None
        return status.value if status is not None and not status.ok else ""

    def _sync(self) -> None:
        """Wait for the gathers on the pool's device (before slots are published or freed)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _read_state(self, state: Optional[StateLoad]) -> Any:
        """Start the read of a stored checkpoint into the state staging (None: none to read).
        Verified by the store on the host (no device digest for sidecars yet)."""
        if state is None or state.key is None:
            return None
        return self.read_state(state.key, self._state_staging)

    def _with_state(
        self, sources: list[torch.Tensor], destinations: list[torch.Tensor], state: StateLoad
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[RowMoves]]:
        """The gather's sources and destinations with the checkpoint's rows appended, and its moves."""
        rows = self.state_rows
        dst_base = len(destinations)
        if state.key is not None:
            staged = rows.staged_sources(self._state_staging)
            moves = rows.staged_moves(len(sources), dst_base, state.slot)
            return [*sources, *staged], [*destinations, *rows.destinations], moves
        moves = rows.host_moves(len(sources), dst_base, state.host_slot, state.slot)
        return [*sources, *rows.host_sources], [*destinations, *rows.destinations], moves
