"""Saria policy configuration: one dataclass tree, validated at load time.

The same tree is built from CLI flags (``saria-replay``) and from SGLang's
``--hicache-storage-backend-extra-config`` JSON (``SariaConfig.from_dict``), so a
bad key or value fails the same way in both places, naming the field and value.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from sglang_saria import policy_names
from sglang_saria.units import ConfigError, parse_count

PROMOTION_MODES = ("zero", "half", "full", "saria")
TRANSFER_MODES = ("serial", "overlap", "coordinated")
PLANNERS = ("saria", "lmcache", "gds-only")
ADMISSION_RULES = ("robust", "paper")
CHECKPOINT_PLACEMENTS = ("sglang", "grid", "prefix-end")  # MetadataConfig.checkpoint_placement
DRAM_RESIDENCIES = ("flat", "tree")  # MetadataConfig.dram_residency
# SGLang 0.5.23's default --chunked-prefill-size on an H100/H200-class GPU (arg_groups/memory_hook.py:
# 8,192 from 60 to 160 GB of GPU memory; 4,096 below or when the memory is unknown, 16,384 above)
SGLANG_CHUNKED_PREFILL_TOKENS = 8192
# a GDN model's kernel chunk (Qwen3.5's `mamba_chunk_size`): SGLang places states on lcm(it, page)
GDN_CHUNK_TOKENS = 64


def _check(cond: bool, name: str, value: Any, why: str) -> None:
    if not cond:
        raise ConfigError(f"{name}={value!r}: {why}")


@dataclass
class AdmissionConfig:
    """Paper 4.2: which nodes are persisted to SSD, and how early writes start."""

    policy: str = "eviction:E2"  # none | full-duplicate | eviction:E<n> | reuse:R<n> | combined:E<n>R<m> | budget:<DWPD>
    # how threshold policies apply their test (docs/fidelity.md): "robust" writes prefix-closed chains started at
    # reusable nodes and does not re-spend the evidence of a copy evicted unread; "paper" is section 4.2 verbatim
    rule: str = "robust"
    prewrite: bool = True
    prewrite_depth_blocks: int = 64  # "near the eviction end": this many LRU-end DRAM nodes are examined
    # budget:<DWPD> write-budget controller (mem_cache/budget.py)
    budget_window_s: float = 86400.0  # the cap holds over any window this long: DWPD x capacity x window / day
    budget_low_water: float = 0.1  # theta_E stays at theta_min while this share of the window's budget is left
    budget_theta_min: int = 2  # theta_E while budget is left
    budget_theta_max: int = 12  # theta_E as the window's budget runs out
    budget_reuse_offset: int = 0  # theta_R = theta_E + offset; 0 = eviction history only (reuse writes spend the budget early)
    budget_capacity_bytes: int = 0  # drive capacity the DWPD refers to; 0 = the SSD tier's capacity
    # loadaware (mem_cache/auto.py; a comparison row, not the operators' auto): write at the first DRAM eviction while more than this much prefill
    # (seconds of GPU work, smoothed over loadaware_tau_s) is queued, at the loadaware_theta_idle-th otherwise.
    # Defaults chosen by the replay sweep of docs/admission.md (350 WEKA sessions, both models,
    # 6,500-20,000 tok/s), judged by its bound: SSD writes within 1.5x the oracle's at a CHAR within
    # 0.02 of full duplicate's.
    loadaware_spend_backlog_s: float = 1.5
    loadaware_theta_idle: int = 2
    loadaware_tau_s: float = 120.0  # the load signal's smoothing time constant
    loadaware_spend_fill: float = 0.7  # loadaware:<DWPD>: spend (E1) only while this share of the window's budget is unspent
    loadaware_reuse_spend: int = 0  # a block reused this often is written at its first eviction, loaded or not (0: off)
    # SGLang driver: prefill tokens/s that turn queued tokens into seconds until the scheduler has measured its
    # own rate (hicache/load_signal.py; the paper's GPU); the replay models its GPU with --prefill-tps instead
    auto_prefill_tps: float = 6500.0
    # auto (mem_cache/learned.py): a write pays when a block's learned reuse odds reach auto_odds over
    # (1 + queued prefill / auto_load_ref_s); its ghost of evicted blocks holds at most auto_max_bytes.
    # auto_odds chosen on WEKA files 1-175 (docs/admission.md)
    auto_odds: float = 4.0
    auto_load_ref_s: float = 1.0
    auto_max_bytes: int = 64 << 20
    # auto: a write leaves its ancestors still in DRAM to their own eviction, where each is written because the
    # descendant's SSD copy needs it (mem_cache/sequencer.py); False: it closes over them at once
    auto_lazy_closure: bool = True
    # auto on hybrid models: close lazily there too (writes still start at checkpoint nodes); False: eagerly
    auto_lazy_hybrid: bool = True
    # SGLang driver: auto's learned state goes to a file beside the store at most this often (hicache/admission_state.py)
    auto_state_save_s: float = 60.0
    # SGLang driver: memory for the page paths of agents' hinted sessions (hicache/hints.py),
    # the sessions hinted longest ago forgotten first past it; 64 MiB holds ~270 sessions of 128K
    # tokens at page 64 (0: remember none, an end hint covers its own request's path only)
    hint_sessions_max_bytes: int = 64 << 20

    def validate(self, prefix: str = "admission") -> None:
        try:
            policy_names.parse(self.policy)
        except ValueError as e:
            raise ConfigError(f"{prefix}.policy={self.policy!r}: {e}") from None
        _check(self.rule in ADMISSION_RULES, f"{prefix}.rule", self.rule, f"must be one of {', '.join(ADMISSION_RULES)}")
        _check(self.prewrite_depth_blocks >= 0, f"{prefix}.prewrite_depth_blocks", self.prewrite_depth_blocks, "must be >= 0")
        _check(self.budget_window_s > 0, f"{prefix}.budget_window_s", self.budget_window_s, "must be > 0")
        _check(0 < self.budget_low_water <= 1, f"{prefix}.budget_low_water", self.budget_low_water, "must be in (0, 1]")
        _check(1 <= self.budget_theta_min <= self.budget_theta_max, f"{prefix}.budget_theta_min", self.budget_theta_min,
               f"must be >= 1 and <= budget_theta_max={self.budget_theta_max}")
        _check(self.budget_reuse_offset >= 0, f"{prefix}.budget_reuse_offset", self.budget_reuse_offset, "must be >= 0")
        _check(self.budget_capacity_bytes >= 0, f"{prefix}.budget_capacity_bytes", self.budget_capacity_bytes, "must be >= 0")
        _check(self.loadaware_spend_backlog_s >= 0, f"{prefix}.loadaware_spend_backlog_s", self.loadaware_spend_backlog_s, "must be >= 0")
        _check(self.loadaware_theta_idle >= 1, f"{prefix}.loadaware_theta_idle", self.loadaware_theta_idle, "must be >= 1")
        _check(self.loadaware_tau_s > 0, f"{prefix}.loadaware_tau_s", self.loadaware_tau_s, "must be > 0")
        _check(0 <= self.loadaware_spend_fill <= 1, f"{prefix}.loadaware_spend_fill", self.loadaware_spend_fill, "must be in [0, 1]")
        _check(self.loadaware_reuse_spend >= 0, f"{prefix}.loadaware_reuse_spend", self.loadaware_reuse_spend, "must be >= 0")
        _check(self.auto_prefill_tps > 0, f"{prefix}.auto_prefill_tps", self.auto_prefill_tps, "must be > 0")
        _check(self.auto_odds > 0, f"{prefix}.auto_odds", self.auto_odds, "must be > 0")
        _check(self.auto_load_ref_s > 0, f"{prefix}.auto_load_ref_s", self.auto_load_ref_s, "must be > 0")
        _check(self.auto_max_bytes > 0, f"{prefix}.auto_max_bytes", self.auto_max_bytes, "must be > 0")
        _check(self.auto_state_save_s > 0, f"{prefix}.auto_state_save_s", self.auto_state_save_s, "must be > 0")
        _check(self.hint_sessions_max_bytes >= 0, f"{prefix}.hint_sessions_max_bytes", self.hint_sessions_max_bytes,
               "must be >= 0 (bytes)")


@dataclass
class MetadataConfig:
    """Paper 4.3: block geometry and how long metadata outlives residency."""

    block_tokens: int = 512
    checkpoint_tokens: int = 16384  # GDN checkpoint spacing (hybrid models only)
    metadata_window_s: float = 7200.0
    # where a hybrid model keeps GDN checkpoints (the replay; the server's tree decides for itself):
    # "sglang": as SGLang 0.5.23's `--mamba-radix-cache-strategy extra_buffer` does, one state at the
    # end of each prefill chunk (on lcm(GDN_CHUNK_TOKENS, block_tokens) from the chunk's start) and at
    # the branching point of a full-attention hit that runs past the last state (`saria-replay`'s
    # default); "grid": every checkpoint_tokens (paper 5.1; the default here, which the committed doc
    # data was generated with); "prefix-end": one per computed prefix, at its last
    # checkpoint_tokens-aligned block (SGLang without chunked prefill or branching points)
    checkpoint_placement: str = "grid"
    # "sglang" placement: SGLang's `--chunked-prefill-size` (tokens per prefill chunk of a request)
    prefill_chunk_tokens: int = SGLANG_CHUNKED_PREFILL_TOKENS
    # which blocks the replay's DRAM tier may hold (the replay; the server's host tier is always a tree):
    # "flat": any block, whatever its ancestors (the default, which the committed doc data was replayed
    # with); "tree": as SGLang 0.5.23's host tier, every DRAM block's ancestors are in DRAM (write-through
    # backs a block's unbacked ancestors up with it, top-down; host eviction takes leaves), so a request
    # never reads DRAM after SSD (replay/core.py, `_enter_dram_tree`)
    dram_residency: str = "flat"

    def validate(self, prefix: str = "metadata") -> None:
        _check(self.block_tokens > 0, f"{prefix}.block_tokens", self.block_tokens, "must be > 0")
        _check(
            self.checkpoint_tokens > 0 and self.checkpoint_tokens % self.block_tokens == 0,
            f"{prefix}.checkpoint_tokens",
            self.checkpoint_tokens,
            f"must be a positive multiple of block_tokens={self.block_tokens}",
        )
        _check(self.metadata_window_s > 0, f"{prefix}.metadata_window_s", self.metadata_window_s, "must be > 0")
        _check(self.checkpoint_placement in CHECKPOINT_PLACEMENTS, f"{prefix}.checkpoint_placement",
               self.checkpoint_placement, f"must be one of {', '.join(CHECKPOINT_PLACEMENTS)}")
        _check(self.dram_residency in DRAM_RESIDENCIES, f"{prefix}.dram_residency", self.dram_residency,
               f"must be one of {', '.join(DRAM_RESIDENCIES)}")
        grid = self.sglang_state_grid_tokens
        _check(self.prefill_chunk_tokens >= grid and self.prefill_chunk_tokens % self.block_tokens == 0,
               f"{prefix}.prefill_chunk_tokens", self.prefill_chunk_tokens,
               f"must be a multiple of block_tokens={self.block_tokens} and at least the state grid ({grid} tokens)")

    @property
    def sglang_state_grid_tokens(self) -> int:
        """SGLang's grid for GDN states (`mamba_checkpoint_grid`): lcm of the kernel chunk and the page."""
        return math.lcm(GDN_CHUNK_TOKENS, self.block_tokens)


@dataclass
class PromotionConfig:
    """Paper 4.4: lazy partial DRAM promotion of SSD hits."""

    mode: str = "saria"  # zero | half | full | saria
    ratio: float = 0.4
    p_tau_s: float = 60.0
    # saria mode: cap r at 1 - B_gds / B_ingress (4.4: DRAM supplies only what GDS cannot); False replays the
    # paper's Figure 15 sweep, whose r reaches 1 (sglang_saria/fidelity/figures.py)
    bandwidth_cap: bool = True

    def validate(self, prefix: str = "promotion") -> None:
        _check(self.mode in PROMOTION_MODES, f"{prefix}.mode", self.mode, f"must be one of {', '.join(PROMOTION_MODES)}")
        _check(0.0 <= self.ratio <= 1.0, f"{prefix}.ratio", self.ratio, "must be in [0, 1]")
        _check(self.p_tau_s >= 0, f"{prefix}.p_tau_s", self.p_tau_s, "must be >= 0")


@dataclass
class BandwidthConfig:
    """Paper 4.4/4.5 bandwidth estimates in GB/s (1 GB = 1e9 bytes)."""

    ingress_gbps: float = 48.0
    gds_gbps: float = 20.0
    dram_gbps: float = 48.0

    def validate(self, prefix: str = "bandwidth") -> None:
        for name in ("ingress_gbps", "gds_gbps", "dram_gbps"):
            v = getattr(self, name)
            _check(v > 0, f"{prefix}.{name}", v, "must be > 0")


@dataclass
class TransferConfig:
    """Paper 4.5 and the baselines: how DRAM and GDS reads share GPU ingress."""

    mode: str = "coordinated"  # serial | overlap | coordinated
    planner: str = "saria"  # saria | lmcache | gds-only
    # SGLang: read SSD hits straight into the device KV pool (False: HiCache's prefetch into host memory)
    direct_reload: bool = True
    # Direct reload runs off the scheduler thread: at most this many tokens read from SSD
    # into device slots at once (later SSD hits wait in the queue; a longer one loads its
    # leading part). Bounds the device slots held by reloads not yet admitted.
    max_inflight_reload_tokens: int = 524288
    # Reloads claim device memory only while every reloaded request not yet admitted stays
    # admissible (mem_cache/reload_admission.py). A reload waits at most this long (seconds)
    # for that memory (then its request recomputes), and its published pages stay locked until
    # its request's prefill at most this long (then evictable, so a request that cannot be
    # admitted ahead of them in SGLang's queue waits no longer).
    reload_hold_s: float = 30.0
    # Pages per direct-reload step (read, verify, gather). The reloader owns two such
    # staging chunks from construction (double buffer: the next chunk reads while this one
    # is gathered), reserved out of SGLang's KV budget (hicache/direct_reload/staging.py).
    reload_chunk_pages: int = 16
    # Benchmark-only: the scheduler thread waits for each direct reload's reads, as the
    # synchronous reload did before direct reload was asynchronous (scripts/bench_serving.py --scenario concurrent).
    blocking_reload: bool = False
    # Diagnostics: a file the reload worker appends one JSON line per paced reload to (the
    # pacer's timestamps of its SSD and DRAM parts, `reload/pacing_trace.py`); "" = none.
    pacing_trace: str = ""

    def validate(self, prefix: str = "transfer") -> None:
        _check(self.mode in TRANSFER_MODES, f"{prefix}.mode", self.mode, f"must be one of {', '.join(TRANSFER_MODES)}")
        _check(self.planner in PLANNERS, f"{prefix}.planner", self.planner, f"must be one of {', '.join(PLANNERS)}")
        cap = self.max_inflight_reload_tokens
        _check(
            isinstance(cap, int) and not isinstance(cap, bool) and cap > 0,
            f"{prefix}.max_inflight_reload_tokens",
            cap,
            "must be a positive integer (tokens)",
        )
        pages = self.reload_chunk_pages
        _check(
            isinstance(pages, int) and not isinstance(pages, bool) and pages > 0,
            f"{prefix}.reload_chunk_pages",
            pages,
            "must be a positive integer (pages)",
        )
        hold = self.reload_hold_s
        _check(
            isinstance(hold, (int, float)) and not isinstance(hold, bool) and hold > 0,
            f"{prefix}.reload_hold_s",
            hold,
            "must be a positive number (seconds)",
        )
        trace = self.pacing_trace
        _check(isinstance(trace, str), f"{prefix}.pacing_trace", trace, "must be a file path or \"\"")
        if trace:
            parent = os.path.dirname(os.path.abspath(trace))
            _check(os.path.isdir(parent), f"{prefix}.pacing_trace", trace, f"directory {parent} does not exist")


@dataclass
class CapacityConfig:
    """Tier capacities in full-attention token equivalents (GDN checkpoints count by bytes)."""

    dram_tokens: int = 1_000_000
    ssd_tokens: int = 10_000_000
    # hybrid models' DRAM: 0 = checkpoints count in dram_tokens by their bytes (the paper's token
    # equivalents); N > 0 = FA blocks fill dram_tokens and at most N checkpoints are held besides,
    # as SGLang's HiCache keeps GDN states in a host pool of their own (the server's replay)
    dram_checkpoints: int = 0

    def validate(self, prefix: str = "capacity") -> None:
        for name in ("dram_tokens", "ssd_tokens", "dram_checkpoints"):
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 0, f"{prefix}.{name}", v, "must be a non-negative integer")


@dataclass
class SariaConfig:
    """Root of the policy configuration tree."""

    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    metadata: MetadataConfig = field(default_factory=MetadataConfig)
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    bandwidth: BandwidthConfig = field(default_factory=BandwidthConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    capacity: CapacityConfig = field(default_factory=CapacityConfig)

    def validate(self) -> "SariaConfig":
        for f in dataclasses.fields(self):
            getattr(self, f.name).validate(f.name)
        return self

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config") -> "SariaConfig":
        """Build from a nested dict (sections as in ``to_dict``); unknown keys are errors.

        Capacities accept strings such as ``"1M"``. ``source`` names where the dict came
        from (a file, ``--hicache-storage-backend-extra-config``) in error messages.
        """
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(d).__name__}")
        sections = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for sec_name, sec_val in d.items():
            if sec_name not in sections:
                raise ConfigError(f"{source}: unknown key {sec_name!r} (known sections: {', '.join(sections)})")
            sec_cls = sections[sec_name].default_factory  # type: ignore[misc]
            if not isinstance(sec_val, dict):
                raise ConfigError(f"{source}: {sec_name} must be an object, got {sec_val!r}")
            known = {f.name: f for f in dataclasses.fields(sec_cls)}
            vals: dict[str, Any] = {}
            for k, v in sec_val.items():
                if k not in known:
                    raise ConfigError(f"{source}: unknown key {sec_name}.{k!r} (known: {', '.join(known)})")
                vals[k] = _coerce(f"{sec_name}.{k}", known[k], v, source)
            kwargs[sec_name] = sec_cls(**vals)
        cfg = cls(**kwargs)
        try:
            return cfg.validate()
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None


def _coerce(name: str, f: dataclasses.Field, v: Any, source: str) -> Any:
    typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    try:
        if name.startswith("capacity."):
            return parse_count(v, name)
        if typ == "int":
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{name}={v!r}: expected an integer")
            return v
        if typ == "float":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"{name}={v!r}: expected a number")
            return float(v)
        if typ == "bool":
            if not isinstance(v, bool):
                raise ConfigError(f"{name}={v!r}: expected true/false")
            return v
        if typ == "str":
            if not isinstance(v, str):
                raise ConfigError(f"{name}={v!r}: expected a string")
            return v
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return v
