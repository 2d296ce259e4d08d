"""Random mixed reloads shaped like SGLang's pools, and an independent row-by-row oracle.

Shared by the in-process tests and `interpreter_check.py` (which runs the Triton kernel
under TRITON_INTERPRET=1 in a subprocess). The oracle indexes whole rows of the original
tensors (`dst[rows] = src[rows]`), never the plan's byte segments, so it checks the plan
construction as well as the copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_saria.kernels.gather import GatherPlan, RowMoves

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class ReloadCase:
    """One reload: tensors bound to the plan, the row moves, and pristine destinations."""

    sources: list[torch.Tensor]
    destinations: list[torch.Tensor]
    moves: list[RowMoves]
    initial: list[torch.Tensor]

    def plan(self, max_segment_bytes: int = 256) -> GatherPlan:
        return GatherPlan.from_rows(self.sources, self.destinations, self.moves, max_segment_bytes=max_segment_bytes)

    def expected(self) -> list[torch.Tensor]:
        out = [t.clone() for t in self.initial]
        for move in self.moves:
            src = self.sources[move.src]
            bits(out[move.dst])[torch.as_tensor(move.dst_rows)] = src.view(_BITS[src.element_size()])[
                torch.as_tensor(move.src_rows)
            ]
        return out

    def reset(self) -> None:
        for dst, init in zip(self.destinations, self.initial):
            dst.copy_(init)


def bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view of the same memory: equality of bits, NaN payloads included."""
    return t.view(_BITS[t.element_size()])


def bit_exact(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> bool:
    return all(torch.equal(bits(a.cpu()), bits(e.cpu())) for a, e in zip(actual, expected))


def _random(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random bit patterns (not just randn values): a gather must move any payload, NaN/Inf included."""
    halves = torch.empty(shape, dtype=dtype).element_size() // 2
    raw = torch.randint(-(2**15), 2**15, (*shape, halves), generator=gen, dtype=torch.int16)
    return raw.view(dtype).reshape(shape)


def make_reload_case(
    seed: int,
    dtype: torch.dtype,
    *,
    fa_layers: int = 2,
    heads: int = 2,
    head_dim: int = 8,
    gdn_layers: int = 2,
    pool_slots: int = 48,
    prefix_tokens: int = 12,
    checkpoints: int = 2,
    device: str = "cpu",
) -> ReloadCase:
    """A prefix whose token rows interleave DRAM hits and SSD hits, plus GDN checkpoints from both.

    Sources: the SSD staging buffer ``[n, fa_layers, 2, heads, head_dim]`` (per-layer K/V
    views), the layer_first host pool ``[2, fa_layers, slots, heads, head_dim]``, and GDN
    checkpoint rows (conv state in ``dtype``, recurrent state in fp32) staged from SSD and
    held in a host mamba pool. Destinations: per-layer ``k_buffer``/``v_buffer``
    ``[slots, heads, head_dim]`` and per-layer ``conv_state``/``temporal_state`` slots.
    """
    gen = torch.Generator().manual_seed(seed)
    on_ssd = torch.rand(prefix_tokens, generator=gen) < 0.5
    ssd_tokens = int(on_ssd.sum())
    staging = _random((ssd_tokens, fa_layers, 2, heads, head_dim), dtype, gen)
    host_kv = _random((2, fa_layers, pool_slots, heads, head_dim), dtype, gen)
    conv_shape, temporal_shape = (3 * heads * head_dim, 3), (heads, head_dim, head_dim)
    conv_stage = _random((checkpoints, gdn_layers, *conv_shape), dtype, gen)
    temporal_stage = _random((checkpoints, gdn_layers, *temporal_shape), torch.float32, gen)
    host_conv = _random((gdn_layers, pool_slots, *conv_shape), dtype, gen)
    host_temporal = _random((gdn_layers, pool_slots, *temporal_shape), torch.float32, gen)

    k_buffer = [_random((pool_slots, heads, head_dim), dtype, gen) for _ in range(fa_layers)]
    v_buffer = [_random((pool_slots, heads, head_dim), dtype, gen) for _ in range(fa_layers)]
    conv_state = _random((gdn_layers, pool_slots + 1, *conv_shape), dtype, gen)
    temporal_state = _random((gdn_layers, pool_slots + 1, *temporal_shape), torch.float32, gen)

    sources: list[torch.Tensor] = []
    destinations: list[torch.Tensor] = []
    moves: list[RowMoves] = []
    token_slots = torch.randperm(pool_slots, generator=gen)[:prefix_tokens]
    host_slots = torch.randperm(pool_slots, generator=gen)[:prefix_tokens]
    ssd_positions = on_ssd.nonzero().flatten()
    dram_positions = (~on_ssd).nonzero().flatten()
    for layer in range(fa_layers):
        for kv, buffers in enumerate((k_buffer, v_buffer)):
            dst = len(destinations)
            destinations.append(buffers[layer])
            sources.append(staging[:, layer, kv])
            moves.append(RowMoves(len(sources) - 1, torch.arange(ssd_tokens), dst, token_slots[ssd_positions]))
            sources.append(host_kv[kv, layer])
            moves.append(RowMoves(len(sources) - 1, host_slots[dram_positions], dst, token_slots[dram_positions]))

    ckpt_slots = torch.randperm(pool_slots + 1, generator=gen)[: 2 * checkpoints]
    host_ckpt = torch.randperm(pool_slots, generator=gen)[:checkpoints]
    for layer in range(gdn_layers):
        for staged, host, pool in ((conv_stage, host_conv, conv_state), (temporal_stage, host_temporal, temporal_state)):
            dst = len(destinations)
            destinations.append(pool[layer])
            sources.append(staged[:, layer])
            moves.append(RowMoves(len(sources) - 1, torch.arange(checkpoints), dst, ckpt_slots[:checkpoints]))
            sources.append(host[layer])
            moves.append(RowMoves(len(sources) - 1, host_ckpt, dst, ckpt_slots[checkpoints:]))

    # Interleave the groups so DRAM, SSD, FA and GDN segments alternate in the launch.
    order = torch.randperm(len(moves), generator=gen).tolist()
    moves = [moves[i] for i in order]
    if device != "cpu":
        sources = [t.to(device) for t in sources]
        destinations = [t.to(device) for t in destinations]
    return ReloadCase(sources, destinations, moves, [t.clone() for t in destinations])
