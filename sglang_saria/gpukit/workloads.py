"""Pools and reload workloads shaped like SGLang's, shared by the benchmarks and the GPU kit.

Plain tensors only (no SGLang import): per-layer K/V device buffers like
``MHATokenToKVPool``, a host pool like ``MHATokenToKVPoolHost``, GDN conv/recurrent states
like ``MambaPool``, and the row moves of one batch of mixed DRAM + SSD reloads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_saria.kernels.gather import RowMoves
from sglang_saria.reload.device import DeviceReloader
from sglang_saria.storage.store import SariaStore

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
PAGE, HEADS, DIM = 16, 8, 128


@dataclass(frozen=True)
class ModelShape:
    """Small hybrid model per TP rank (Qwen3-Next-like ratio: 3 GDN layers per FA layer)."""

    fa_layers: int = 4
    kv_heads: int = 2
    head_dim: int = 128
    gdn_layers: int = 12
    conv_dim: int = 1024
    conv_width: int = 3
    value_heads: int = 8
    state_dim: int = 64
    page_size: int = 16


@dataclass
class Workload:
    sources: list[torch.Tensor]
    destinations: list[torch.Tensor]
    moves: list[RowMoves]
    requests: int
    tokens: int


def build_workload(shape: ModelShape, tokens: int, dtype: torch.dtype, device: str, host_device: str, seed: int) -> Workload:
    """Allocate pools shaped like SGLang's and the moves of one batch of mixed reloads."""
    gen = torch.Generator().manual_seed(seed)
    s = shape
    pages = tokens // s.page_size
    requests = max(1, tokens // 512)
    pool_slots = 2 * tokens
    on_ssd = torch.rand(pages, generator=gen) < 0.5  # page-granular DRAM/SSD interleaving
    ssd_pages = on_ssd.nonzero().flatten()
    dram_pages = (~on_ssd).nonzero().flatten()

    def rand(*size: int, dt: torch.dtype = dtype, dev: str = device) -> torch.Tensor:
        return torch.randn(*size, generator=gen).to(dt).to(dev)

    staging = rand(len(ssd_pages) * s.page_size, s.fa_layers, 2, s.kv_heads, s.head_dim)
    host_kv = rand(2, s.fa_layers, pool_slots, s.kv_heads, s.head_dim, dev=host_device)
    temporal = (s.value_heads, s.state_dim, s.state_dim)
    ckpt_conv_stage = rand(requests, s.gdn_layers, s.conv_dim, s.conv_width)
    ckpt_temporal_stage = rand(requests, s.gdn_layers, *temporal, dt=torch.float32)
    host_conv = rand(s.gdn_layers, requests, s.conv_dim, s.conv_width, dev=host_device)
    host_temporal = rand(s.gdn_layers, requests, *temporal, dt=torch.float32, dev=host_device)
    if host_device == "cpu" and device == "cuda":
        host_kv, host_conv, host_temporal = (t.pin_memory() for t in (host_kv, host_conv, host_temporal))

    k_buffer = [torch.zeros(pool_slots + s.page_size, s.kv_heads, s.head_dim, dtype=dtype, device=device) for _ in range(s.fa_layers)]
    v_buffer = [torch.zeros_like(k) for k in k_buffer]
    conv_state = torch.zeros(s.gdn_layers, 2 * requests + 1, s.conv_dim, s.conv_width, dtype=dtype, device=device)
    temporal_state = torch.zeros(s.gdn_layers, 2 * requests + 1, *temporal, dtype=torch.float32, device=device)

    def page_rows(page_ids: torch.Tensor) -> torch.Tensor:
        return (page_ids[:, None] * s.page_size + torch.arange(s.page_size)).flatten()

    dst_slots = torch.randperm(pool_slots, generator=gen)[:tokens] + s.page_size
    host_slots = torch.randperm(pool_slots, generator=gen)[:tokens]
    ssd_rows, dram_rows = page_rows(ssd_pages), page_rows(dram_pages)
    sources: list[torch.Tensor] = []
    destinations: list[torch.Tensor] = []
    moves: list[RowMoves] = []
    for layer in range(s.fa_layers):
        for kv, buffers in enumerate((k_buffer, v_buffer)):
            destinations.append(buffers[layer])
            sources += [staging[:, layer, kv], host_kv[kv, layer]]
            dst = len(destinations) - 1
            moves.append(RowMoves(len(sources) - 2, torch.arange(len(ssd_rows)), dst, dst_slots[ssd_rows]))
            moves.append(RowMoves(len(sources) - 1, host_slots[dram_rows], dst, dst_slots[dram_rows]))
    from_ssd = torch.rand(requests, generator=gen) < 0.5
    slots = torch.randperm(2 * requests + 1, generator=gen)[:requests]
    for layer in range(s.gdn_layers):
        for stage, host, pool in ((ckpt_conv_stage, host_conv, conv_state), (ckpt_temporal_stage, host_temporal, temporal_state)):
            destinations.append(pool[layer])
            sources += [stage[:, layer], host[layer]]
            dst = len(destinations) - 1
            ssd_req, dram_req = from_ssd.nonzero().flatten(), (~from_ssd).nonzero().flatten()
            moves.append(RowMoves(len(sources) - 2, ssd_req, dst, slots[ssd_req]))
            moves.append(RowMoves(len(sources) - 1, dram_req, dst, slots[dram_req]))
    return Workload(sources, destinations, moves, requests, tokens)


def row_loop(w: Workload) -> None:
    for m in w.moves:
        src, dst = w.sources[m.src], w.destinations[m.dst]
        for s, d in zip(torch.as_tensor(m.src_rows).tolist(), torch.as_tensor(m.dst_rows).tolist()):
            dst[d].copy_(src[s], non_blocking=True)


def per_group(w: Workload) -> None:
    for m in w.moves:
        dst = w.destinations[m.dst]
        src_rows = torch.as_tensor(m.src_rows).to(w.sources[m.src].device)
        dst[torch.as_tensor(m.dst_rows).to(dst.device)] = w.sources[m.src][src_rows].to(dst.device)


def snapshot(w: Workload) -> list[torch.Tensor]:
    return [t.detach().clone().cpu() for t in w.destinations]


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x.view(_BITS[x.element_size()]), y.view(_BITS[y.element_size()])) for x, y in zip(a, b))


class Pools:
    """A device pool (per-layer K/V) and a page_first_direct host pool, as SGLang lays them out."""

    @staticmethod
    def page_bytes(layers: int) -> int:
        """One stored page: K and V of PAGE tokens x ``layers`` (bf16)."""
        return 2 * layers * PAGE * HEADS * DIM * 2

    def __init__(self, pages: int, layers: int, device: str) -> None:
        slots = (pages + 1) * PAGE
        self.k_buffer = [torch.zeros(slots, HEADS, DIM, dtype=torch.bfloat16, device=device) for _ in range(layers)]
        self.v_buffer = [torch.zeros(slots, HEADS, DIM, dtype=torch.bfloat16, device=device) for _ in range(layers)]
        self.kv_buffer = torch.zeros(2, pages, layers, PAGE, HEADS, DIM, dtype=torch.bfloat16)
        if device == "cuda":
            self.kv_buffer = self.kv_buffer.pin_memory()
        self.layers = layers


def staged(store: SariaStore, pools: Pools, reloader: DeviceReloader, keys: list[str], host_pages: list[int], slots: torch.Tensor) -> None:
    """HiCache's path: read each page into its host pool page, then copy host -> device.

    The copy is the reloader's host-pool gather (pinned memory read over UVA on CUDA, as
    SGLang's transfer kernels do; indexed row copies on CPU), so set against a direct reload
    through the same reloader only the SSD leg differs: into device memory or into DRAM first.
    """
    futures = [store.get_async(k, [pools.kv_buffer[0, p].view(-1), pools.kv_buffer[1, p].view(-1)]) for k, p in zip(keys, host_pages)]
    assert all(f.result().ok for f in futures)
    host_slots = torch.cat([torch.arange(PAGE) + p * PAGE for p in host_pages])
    outcome = reloader.load([], slots[:0], host_slots, slots)
    assert outcome.ok, outcome.reason


@dataclass
class _StateInfo:
    """The device tensors of a `MambaStateBufferInfo`: [layer, slot, *shape]."""

    temporal: torch.Tensor
    conv: tuple[torch.Tensor, ...]


class HybridPools:
    """A hybrid model's pools as SGLang lays them out: `HybridLinearKVPool` (its FA layers in
    ``full_kv_pool`` behind ``full_attention_layer_id_mapping``, here FA every 4th model layer),
    the device mamba pool (fp32 temporal, bf16 conv) and a page_first `MambaPoolHost`, for
    reloads of FA pages plus the GDN checkpoint at their end."""

    layout = "page_first"  # the mamba host pool's
    page_size = 1
    slot_state_device_tensors = ()
    mtp_draft_buffer_infos = ()

    def __init__(self, pages: int, shape: ModelShape, device: str) -> None:
        s = shape
        self.full_kv_pool = Pools(pages, s.fa_layers, device)
        self.full_attention_layer_id_mapping = {4 * i + 3: i for i in range(s.fa_layers)}
        temporal, conv = (s.value_heads, s.state_dim, s.state_dim), (s.conv_dim, s.conv_width)
        self.buffer_info = _StateInfo(
            torch.zeros(s.gdn_layers, 4, *temporal, dtype=torch.float32, device=device),
            (torch.zeros(s.gdn_layers, 4, *conv, dtype=torch.bfloat16, device=device),),
        )
        self.temporal_buffer = torch.zeros(4, s.gdn_layers, 1, *temporal, dtype=torch.float32)
        self.conv_buffer = [torch.zeros(4, s.gdn_layers, 1, *conv, dtype=torch.bfloat16)]
        if device == "cuda":
            self.temporal_buffer = self.temporal_buffer.pin_memory()
            self.conv_buffer = [self.conv_buffer[0].pin_memory()]
        self.shape = s

    def get_size_per_token(self) -> int:
        """Bytes of one checkpoint (a stored MAMBA sidecar page)."""
        return self.temporal_buffer[0].numel() * 4 + self.conv_buffer[0][0].numel() * 2

    def host_state_page(self, slot: int) -> list[torch.Tensor]:
        """Host slot ``slot`` as the store reads a sidecar page into it (temporal, then conv)."""
        return [self.temporal_buffer[slot].view(-1), self.conv_buffer[0][slot].view(-1)]


def staged_hybrid(
    store: SariaStore, pools: HybridPools, reloader: DeviceReloader, keys: list[str], state_key: str,
    host_pages: list[int], slots: torch.Tensor, state_slot: int,
) -> None:
    """HiCache's hybrid path: the FA pages and the checkpoint read into the host pools, then
    copied host -> device (the reloader's host gather: FA rows and the state in one launch)."""
    from sglang_saria.reload.device import StateLoad

    kv = pools.full_kv_pool.kv_buffer
    futures = [store.get_async(k, [kv[0, p].view(-1), kv[1, p].view(-1)]) for k, p in zip(keys, host_pages)]
    futures.append(store.get_async(state_key, pools.host_state_page(0)))
    assert all(f.result().ok for f in futures)
    host_slots = torch.cat([torch.arange(PAGE) + p * PAGE for p in host_pages])
    outcome = reloader.load([], slots[:0], host_slots, slots, state=StateLoad(state_slot, host_slot=0))
    assert outcome.ok and outcome.state_loaded, outcome.reason
