"""Radix-tree hot path: SGLang's Python TreeCore (used with `saria`) against its Rust TreeCore.

With `--hicache-storage-backend saria`, `SariaRadixCache` selects the Python TreeCore (its subclass
`hicache/tree_core.py` holds the host eviction gate). This benchmark measures what that costs. Both cores are built
the way SGLang builds them for a FULL-attention model (``UnifiedRadixCache`` over a real
token pool, no server) and driven through the same agent-like workload:

- a shared system prefix, ``--sessions`` sessions whose histories grow turn by turn
  (each turn: a user message, then the model's output);
- per turn and session: ``match_prefix`` of the prompt (a new request), ``insert`` of
  prompt + output (the request cached when it finishes), and the node locked while the
  request "runs": the ``--running`` most recent requests hold locks, as running requests do;
- then ``evict`` in ``--evict-chunk``-token calls until nothing unlocked is left.

Prints ops/s per core and op (median of ``--repeats``; cores alternate within a repeat,
so both see the same machine noise), the Python/Rust time ratio per op, and each core's
tree time per scheduler step at ``--running`` requests against the floor of a GPU decode
step at that batch (see ``StepModel``).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

from sglang_saria.model_specs import get_model_spec

CORES = ("python", "rust")
OPS = ("match", "insert", "evict")


@dataclass(frozen=True)
class Workload:
    """Token ids of every request, in arrival order: (session, prompt, output)."""

    page_size: int
    requests: list[tuple[int, list[int], list[int]]]

    @property
    def tokens(self) -> int:
        """Upper bound of the KV slots the workload holds when nothing is evicted."""
        per_session: dict[int, int] = {}
        for s, prompt, out in self.requests:
            per_session[s] = len(prompt) + len(out)
        return sum(per_session.values())


def make_workload(sessions: int, turns: int, system_tokens: int, page_size: int, seed: int) -> Workload:
    """Agent-like sessions over one system prefix; lengths page-aligned as SGLang caches them."""
    rng = random.Random(seed)
    fresh = iter(range(1, 1 << 40))  # every message gets new token ids: no accidental sharing

    def message(lo: int, hi: int) -> list[int]:
        n = max(page_size, rng.randint(lo, hi) // page_size * page_size)
        return [next(fresh) for _ in range(n)]

    system = message(system_tokens, system_tokens)
    history = {s: list(system) for s in range(sessions)}
    requests = []
    for _ in range(turns):
        for s in rng.sample(range(sessions), sessions):
            prompt = history[s] + message(64, 512)
            out = message(32, 256)
            requests.append((s, prompt, out))
            history[s] = prompt + out
    return Workload(page_size, requests)


def build_cache(core: str, page_size: int, kv_tokens: int) -> UnifiedRadixCache:
    """A FULL-attention UnifiedRadixCache on CPU, as SGLang's own unit fixtures build one."""
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page_size))
    kv_pool = MHATokenToKVPool(
        size=kv_tokens, page_size=page_size, dtype=torch.bfloat16, head_num=1, head_dim=8,
        layer_num=1, device="cpu", enable_memory_saver=False,
    )
    allocator = TokenToKVPoolAllocator(
        size=kv_tokens, dtype=torch.bfloat16, device="cpu", kvcache=kv_pool, need_sort=False
    )
    params = CacheInitParams(
        req_to_token_pool=ReqToTokenPool(size=4, max_context_len=16, device="cpu", enable_memory_saver=False),
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        disable=False,
        tree_components=(ComponentType.FULL,),
        eviction_policy="lru",
        tree_core_backend=core,
    )
    cache = UnifiedRadixCache(params=params)
    if cache._tree_core_backend != core:
        raise SystemExit(f"asked for the {core} TreeCore, SGLang selected {cache._tree_core_backend}")
    return cache


@dataclass
class Timings:
    """Seconds spent in each tree op, and how many calls."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(OPS, 0.0))
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPS, 0))

    def timed(self, op: str, fn: Callable[[], object]) -> object:
        t0 = time.perf_counter()
        out = fn()
        self.seconds[op] += time.perf_counter() - t0
        self.calls[op] += 1
        return out

    def per_call_s(self, op: str) -> float:
        return self.seconds[op] / max(1, self.calls[op])


def run(core: str, wl: Workload, running: int, evict_chunk: int) -> Timings:
    """Drive one fresh cache through the workload; only the tree calls are timed."""
    pool_tokens = wl.tokens + 1024
    cache = build_cache(core, wl.page_size, pool_tokens)
    alloc = cache.token_to_kv_pool_allocator
    t = Timings()
    locks: deque = deque()
    gc.collect()
    gc.disable()  # a collection inside one core's timed call is noise, not the core's cost
    try:
        for _, prompt, out in wl.requests:
            key = RadixKey(array("q", prompt))
            m = t.timed("match", lambda: cache.match_prefix(MatchPrefixParams(key=key)))
            full = array("q", prompt + out)
            prefix = cache.path_device_indices(m.last_device_node)[: m.device_prefix_len]
            new = alloc.alloc(len(full) - m.device_prefix_len)
            value = torch.cat([prefix.to(torch.int64), new.to(torch.int64)])
            # prev_prefix_len, as SGLang's cache_finished_req passes it: the matched prefix's
            # slots are the tree's own, not duplicates for the insert to free.
            params = InsertParams(key=RadixKey(full), value=value, prev_prefix_len=m.device_prefix_len)
            res = t.timed("insert", lambda: cache.insert(params))
            if res.prefix_len != m.device_prefix_len:  # the prompt was just matched and locked
                raise RuntimeError(f"insert found {res.prefix_len} cached tokens, match {m.device_prefix_len}")
            node = cache.match_prefix(MatchPrefixParams(key=RadixKey(full))).last_device_node
            locks.append((node, cache.inc_lock_ref(node).to_dec_params()))
            if len(locks) > running:
                cache.dec_lock_ref(*locks.popleft())
        while cache.evictable_size() > 0:
            r = t.timed("evict", lambda: cache.evict(EvictParams(num_tokens=evict_chunk)))
            if r.num_tokens_evicted == 0:
                break
    finally:
        gc.enable()
    held = alloc.available_size() + cache.protected_size() + cache.evictable_size()
    if held != pool_tokens:  # a slot freed twice or never: the timings would be of a broken tree
        raise RuntimeError(f"{core} core: free + locked + evictable = {held} slots, pool has {pool_tokens}")
    return t


@dataclass
class StepModel:
    """Tree calls one scheduler step makes at ``running`` requests, against a decode step.

    Decode steps do not touch the tree for requests that keep decoding. A request that
    finishes is cached (one insert) and replaced by a new one (one match at admission, one
    insert when its prefill is cached): ``running / output_tokens`` requests turn over per
    step. The upper bound lets every running request match and insert in every step.

    The step it is compared with is a floor, not a measurement: a decode step reads the
    weights and every running request's KV from HBM at least once, so it takes no less than
    ``(weights + running x context x KV bytes per token) / HBM bandwidth``.
    """

    running: int
    output_tokens: int
    context_tokens: float  # mean context of a running request
    kv_bytes_per_token: int
    weights_bytes: float
    hbm_bytes_per_s: float

    def turnover(self, t: Timings) -> float:
        per_req = t.per_call_s("match") + 2 * t.per_call_s("insert")
        return self.running / self.output_tokens * per_req

    def upper_bound(self, t: Timings) -> float:
        return self.running * (t.per_call_s("match") + t.per_call_s("insert"))

    @property
    def floor_s(self) -> float:
        kv = self.running * self.context_tokens * self.kv_bytes_per_token
        return (self.weights_bytes + kv) / self.hbm_bytes_per_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="saria-bench-tree", description=__doc__.splitlines()[0])
    ap.add_argument("--page-sizes", default="16,1")
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--system-tokens", type=int, default=512)
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--evict-chunk", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output-tokens", type=int, default=256, help="mean decode length (turnover model)")
    ap.add_argument("--model", default="qwen3-8b", help="KV bytes per token of the step floor (model_specs)")
    ap.add_argument("--weights-gb", type=float, default=16.4, help="weights read per decode step (Qwen3-8B bf16)")
    ap.add_argument("--hbm-tbps", type=float, default=4.8, help="HBM bandwidth of the GPU (H200)")
    args = ap.parse_args(argv)

    for ps in (int(p) for p in args.page_sizes.split(",")):
        wl = make_workload(args.sessions, args.turns, args.system_tokens, ps, seed=0)
        recent = wl.requests[-args.running:]
        step = StepModel(
            args.running, args.output_tokens,
            context_tokens=statistics.mean(len(p) + len(o) for _, p, o in recent),
            kv_bytes_per_token=get_model_spec(args.model).kv_bytes_per_token,
            weights_bytes=args.weights_gb * 1e9, hbm_bytes_per_s=args.hbm_tbps * 1e12,
        )
        runs: dict[str, list[Timings]] = {c: [] for c in CORES}
        for i in range(args.repeats):
            for core in CORES if i % 2 == 0 else CORES[::-1]:
                runs[core].append(run(core, wl, args.running, args.evict_chunk))
        print(f"\npage_size={ps}: {len(wl.requests)} requests, {wl.tokens} tokens, "
              f"{args.running} locked (running), median of {args.repeats}")
        print(f"{'op':8} {'calls':>7} {'python ops/s':>13} {'rust ops/s':>11} {'python/rust time':>17}")
        med = {c: {op: statistics.median(r.per_call_s(op) for r in runs[c]) for op in OPS} for c in CORES}
        for op in OPS:
            calls = runs["python"][0].calls[op]
            if calls == 0:
                print(f"{op:8} {calls:7d}  (nothing to {op}: raise --sessions above --running)")
                continue
            py, rs = med["python"][op], med["rust"][op]
            print(f"{op:8} {calls:7d} {1 / py:13.0f} {1 / rs:11.0f} {py / rs:17.2f}")
        py_t = Timings(seconds={op: med["python"][op] for op in OPS}, calls=dict.fromkeys(OPS, 1))
        rs_t = Timings(seconds={op: med["rust"][op] for op in OPS}, calls=dict.fromkeys(OPS, 1))
        floor_ms = step.floor_s * 1e3
        print(f"decode step floor at {args.running} running ({args.model}, {step.context_tokens:.0f}-token "
              f"contexts, {args.weights_gb:g} GB weights, {args.hbm_tbps:g} TB/s): {floor_ms:.2f} ms")
        for name, fn in (("turnover", step.turnover), ("upper bound", step.upper_bound)):
            py_ms, rs_ms = fn(py_t) * 1e3, fn(rs_t) * 1e3
            print(f"tree ms/step ({name}, {args.output_tokens}-token outputs): python {py_ms:.3f} "
                  f"({py_ms / floor_ms:.1%} of the floor), rust {rs_ms:.3f} ({rs_ms / floor_ms:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
