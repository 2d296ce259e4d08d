"""Hybrid reloads shaped like SGLang's pools: a real store holding FA pages and a GDN
sidecar page, a host KV pool and a host `MambaPoolHost`-like pool, a hybrid device pool
(full-attention layers 1 and 3 of a 4-layer model behind `full_attention_layer_id_mapping`)
and a device mamba pool with an fp32 temporal state next to a conv state of the KV dtype.

Shared by the in-process tests (the gather's torch path) and `hybrid_interpreter_check.py`
(the Triton kernel under TRITON_INTERPRET=1). Expectations come from the tensors the pages
were made of, never from the plan, so the check covers plan construction and the copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang_saria.reload.device import DeviceReloader, StateLoad
from sglang_saria.reload.gdn_state import StateRows
from sglang_saria.storage.store import SariaStore

PAGE, FA_LAYERS, HEADS, DIM = 4, 2, 2, 8
MAMBA_LAYERS, HV, V, K, CONV_DIM, CONV_WIN = 3, 2, 4, 4, 12, 3
DEVICE_SLOTS, HOST_SLOTS, MAMBA_SLOTS, HOST_STATES = 64, 48, 6, 4
NODE_SLOT, HOST_STATE_SLOT = 4, 2  # the boundary node's device mamba slot; a host checkpoint's slot
SSD_PAGE_SLOTS = (9, 2, 14, 5, 11)  # device pages of the SSD FA pages, out of order on purpose
HOST_PAGES = (3, 7)  # host pool pages of the DRAM FA pages
HOST_DEVICE_PAGES = (1, 12)  # their device pages


class FullKVPool:
    def __init__(self, dtype: torch.dtype, device: str = "cpu") -> None:
        self.k_buffer = [torch.zeros(DEVICE_SLOTS, HEADS, DIM, dtype=dtype, device=device) for _ in range(FA_LAYERS)]
        self.v_buffer = [torch.zeros(DEVICE_SLOTS, HEADS, DIM, dtype=dtype, device=device) for _ in range(FA_LAYERS)]


class HybridPool:
    """The attributes of SGLang's HybridLinearKVPool the reloader reads."""

    def __init__(self, dtype: torch.dtype, device: str = "cpu") -> None:
        self.full_kv_pool = FullKVPool(dtype, device)
        self.full_attention_layer_id_mapping = {1: 0, 3: 1}


def _host(t: torch.Tensor, device: str) -> torch.Tensor:
    """Host pools are pinned when the device pool is on a GPU (the kernel reads them over UVA)."""
    return t.pin_memory() if device == "cuda" else t


class HostKVPool:
    """MHATokenToKVPoolHost, page_first: kv_buffer [2, size, layer, head, dim]."""

    def __init__(self, dtype: torch.dtype, gen: torch.Generator, device: str = "cpu") -> None:
        self.kv_buffer = _host(torch.randn(2, HOST_SLOTS, FA_LAYERS, HEADS, DIM, generator=gen).to(dtype), device)


@dataclass
class StateInfo:
    temporal: torch.Tensor
    conv: tuple[torch.Tensor, ...]


class HostMambaPool:
    """MambaPoolHost, page_first: buffers [slot, layer, 1, *shape]; buffer_info: the device tensors."""

    layout = "page_first"
    page_size = 1
    slot_state_device_tensors = ()
    mtp_draft_buffer_infos = ()

    def __init__(self, dtype: torch.dtype, gen: torch.Generator, device: str = "cpu") -> None:
        self.buffer_info = StateInfo(
            torch.zeros(MAMBA_LAYERS, MAMBA_SLOTS, HV, V, K, dtype=torch.float32, device=device),
            (torch.zeros(MAMBA_LAYERS, MAMBA_SLOTS, CONV_DIM, CONV_WIN, dtype=dtype, device=device),),
        )
        self.temporal_buffer = _host(torch.randn(HOST_STATES, MAMBA_LAYERS, 1, HV, V, K, generator=gen), device)
        self.conv_buffer = [_host(torch.randn(HOST_STATES, MAMBA_LAYERS, 1, CONV_DIM, CONV_WIN, generator=gen).to(dtype), device)]

    def get_size_per_token(self) -> int:
        return MAMBA_LAYERS * (HV * V * K * 4 + CONV_DIM * CONV_WIN * self.conv_buffer[0].element_size())


def kv_page_bytes(dtype: torch.dtype) -> int:
    return 2 * FA_LAYERS * PAGE * HEADS * DIM * dtype.itemsize


def stored_kv_page(kv: torch.Tensor) -> torch.Tensor:
    """kv [2, layer, page, head, dim] as the page_first host pool flattens a page."""
    return kv.permute(0, 2, 1, 3, 4).contiguous().flatten()


def stored_state_page(temporal: torch.Tensor, conv: torch.Tensor) -> torch.Tensor:
    """A checkpoint as MambaPoolHost.get_data_page flattens it: temporal then conv bytes."""
    return torch.cat([t.contiguous().view(torch.uint8).flatten() for t in (temporal, conv)])


@dataclass
class HybridCase:
    """One hybrid reload: ``ssd_pages`` FA pages from the store, the DRAM pages from the
    host pool, the checkpoint from ``state_from`` ("ssd" or "dram")."""

    dtype: torch.dtype
    ssd_pages: int
    dram_pages: int
    state_from: str
    seed: int = 0
    device: str = "cpu"  # of the device pools and the reloader's staging

    def run(self, store: SariaStore, chunk_pages: int = 2) -> dict:
        gen = torch.Generator().manual_seed(self.seed)
        dtype = self.dtype
        kvs = [torch.randn(2, FA_LAYERS, PAGE, HEADS, DIM, generator=gen).to(dtype) for _ in range(self.ssd_pages)]
        hashes = [f"s{self.seed}p{i}" for i in range(self.ssd_pages)]
        for h, kv in zip(hashes, kvs):
            assert store.put(h, stored_kv_page(kv)).ok
        host_kv, host_mamba = HostKVPool(dtype, gen, self.device), HostMambaPool(dtype, gen, self.device)
        ck_temporal = torch.randn(MAMBA_LAYERS, HV, V, K, generator=gen)
        ck_conv = torch.randn(MAMBA_LAYERS, CONV_DIM, CONV_WIN, generator=gen).to(dtype)
        state_key = f"s{self.seed}.mamba"
        assert store.put(state_key, stored_state_page(ck_temporal, ck_conv)).ok
        if self.state_from == "dram":
            ck_temporal = host_mamba.temporal_buffer[HOST_STATE_SLOT, :, 0].clone()
            ck_conv = host_mamba.conv_buffer[0][HOST_STATE_SLOT, :, 0].clone()
        pool = HybridPool(dtype, self.device)
        reloader = DeviceReloader(
            store.get_async, pool, "page_first", PAGE, kv_page_bytes(dtype), host_pool=host_kv,
            chunk_pages=chunk_pages, state_rows=StateRows.of_pools(host_mamba), read_state=store.get_async,
        )
        slots = _token_slots(SSD_PAGE_SLOTS[: self.ssd_pages])
        host_slots = _token_slots(HOST_PAGES[: self.dram_pages])
        host_dst = _token_slots(HOST_DEVICE_PAGES[: self.dram_pages])
        state = StateLoad(NODE_SLOT, key=state_key) if self.state_from == "ssd" else StateLoad(NODE_SLOT, host_slot=HOST_STATE_SLOT)
        outcome = reloader.load(hashes, slots, host_slots, host_dst, state=state)
        fa = pool.full_kv_pool
        got_fa = [t.cpu() for t in fa.k_buffer + fa.v_buffer]
        want_k, want_v = [torch.zeros_like(t) for t in got_fa[:FA_LAYERS]], [torch.zeros_like(t) for t in got_fa[FA_LAYERS:]]
        for kv, page in zip(kvs, SSD_PAGE_SLOTS):
            for l in range(FA_LAYERS):
                want_k[l][page * PAGE : (page + 1) * PAGE] = kv[0, l]
                want_v[l][page * PAGE : (page + 1) * PAGE] = kv[1, l]
        for src, dst in zip(HOST_PAGES[: self.dram_pages], HOST_DEVICE_PAGES[: self.dram_pages]):
            for l in range(FA_LAYERS):
                want_k[l][dst * PAGE : (dst + 1) * PAGE] = host_kv.kv_buffer[0][src * PAGE : (src + 1) * PAGE, l]
                want_v[l][dst * PAGE : (dst + 1) * PAGE] = host_kv.kv_buffer[1][src * PAGE : (src + 1) * PAGE, l]
        info = host_mamba.buffer_info
        got_state = [info.temporal.cpu(), info.conv[0].cpu()]
        want_temporal, want_conv = torch.zeros_like(got_state[0]), torch.zeros_like(got_state[1])
        want_temporal[:, NODE_SLOT], want_conv[:, NODE_SLOT] = ck_temporal, ck_conv
        return {
            "ok": outcome.ok,
            "pages": outcome.pages,
            "state_loaded": outcome.state_loaded,
            "fa_bit_exact": _bits_equal(got_fa, want_k + want_v),
            "state_bit_exact": _bits_equal(got_state, [want_temporal, want_conv]),
        }


def _token_slots(pages: tuple[int, ...]) -> torch.Tensor:
    if not pages:
        return torch.zeros(0, dtype=torch.int64)
    return torch.cat([torch.arange(PAGE) + PAGE * p for p in pages])


def _bits_equal(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    """Bitwise equality (NaN payloads and -0.0 included)."""
    return all(
        g.dtype == w.dtype and torch.equal(g.contiguous().view(torch.uint8), w.contiguous().view(torch.uint8))
        for g, w in zip(got, want)
    )


CASES = {
    "ssd_only": dict(ssd_pages=5, dram_pages=0, state_from="ssd"),
    "dram_and_ssd": dict(ssd_pages=3, dram_pages=2, state_from="ssd"),
    "state_ssd_fa_dram": dict(ssd_pages=0, dram_pages=2, state_from="ssd"),
    "fa_ssd_state_dram": dict(ssd_pages=3, dram_pages=0, state_from="dram"),
}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def case(name: str, dtype_name: str, seed: Optional[int] = None, device: str = "cpu") -> HybridCase:
    default = list(CASES).index(name) * len(DTYPES) + list(DTYPES).index(dtype_name)
    return HybridCase(DTYPES[dtype_name], seed=default if seed is None else seed, device=device, **CASES[name])
