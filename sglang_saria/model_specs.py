"""KV footprint of the evaluated models, computed from their attention structure.

Bytes decide everything Saria measures (SSD writes vs. the DWPD budget, transfer
times), so they are derived from layer counts and state shapes, never hard-coded.
"""

from __future__ import annotations

from dataclasses import dataclass

_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


@dataclass(frozen=True)
class ModelSpec:
    """Attention structure of a model; full-attention (FA) and gated-delta-net (GDN) layers.

    GDN state per layer follows Qwen3-Next / Qwen3.5: a recurrent state of
    ``gdn_value_heads x gdn_key_head_dim x gdn_value_head_dim`` and a causal-conv state of
    ``conv_dim x (gdn_conv_kernel - 1)`` with ``conv_dim = 2*key_heads*key_dim + value_heads*value_dim``.
    """

    name: str
    fa_layers: int
    kv_heads: int
    head_dim: int
    kv_dtype: str = "bf16"
    gdn_layers: int = 0
    gdn_key_heads: int = 0
    gdn_value_heads: int = 0
    gdn_key_head_dim: int = 0
    gdn_value_head_dim: int = 0
    gdn_conv_kernel: int = 4
    gdn_state_dtype: str = "fp32"
    gdn_conv_dtype: str = "bf16"
    default_block_tokens: int = 512

    def __post_init__(self) -> None:
        for f in ("fa_layers", "kv_heads", "head_dim"):
            if getattr(self, f) <= 0:
                raise ValueError(f"model spec {self.name!r}: {f}={getattr(self, f)!r} must be > 0")
        for f in ("kv_dtype", "gdn_state_dtype", "gdn_conv_dtype"):
            if getattr(self, f) not in _DTYPE_BYTES:
                raise ValueError(f"model spec {self.name!r}: {f}={getattr(self, f)!r} not in {sorted(_DTYPE_BYTES)}")
        if self.gdn_layers < 0:
            raise ValueError(f"model spec {self.name!r}: gdn_layers={self.gdn_layers} must be >= 0")

    @property
    def is_hybrid(self) -> bool:
        return self.gdn_layers > 0

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every FA layer for one token."""
        return 2 * self.fa_layers * self.kv_heads * self.head_dim * _DTYPE_BYTES[self.kv_dtype]

    @property
    def checkpoint_bytes(self) -> int:
        """One GDN checkpoint: recurrent + conv state of every GDN layer (0 for FA-only models)."""
        if not self.is_hybrid:
            return 0
        recurrent = self.gdn_value_heads * self.gdn_key_head_dim * self.gdn_value_head_dim
        conv_dim = 2 * self.gdn_key_heads * self.gdn_key_head_dim + self.gdn_value_heads * self.gdn_value_head_dim
        conv = conv_dim * (self.gdn_conv_kernel - 1)
        per_layer = recurrent * _DTYPE_BYTES[self.gdn_state_dtype] + conv * _DTYPE_BYTES[self.gdn_conv_dtype]
        return self.gdn_layers * per_layer

    @property
    def checkpoint_token_equiv(self) -> int:
        """Capacity a checkpoint occupies, in FA token equivalents (paper 5.1: budgets are FA tokens)."""
        if not self.is_hybrid:
            return 0
        return -(-self.checkpoint_bytes // self.kv_bytes_per_token)


_QWEN35_GDN = dict(
    gdn_key_heads=16, gdn_value_heads=32, gdn_key_head_dim=128, gdn_value_head_dim=128, default_block_tokens=1024
)

MODEL_SPECS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec("qwen3-8b", fa_layers=36, kv_heads=8, head_dim=128),
        ModelSpec("qwen3-1.7b", fa_layers=20, kv_heads=8, head_dim=128),
        ModelSpec("qwen3.5-9b", fa_layers=8, kv_heads=4, head_dim=256, gdn_layers=24, **_QWEN35_GDN),
        ModelSpec("qwen3.5-5.6b", fa_layers=5, kv_heads=4, head_dim=256, gdn_layers=15, **_QWEN35_GDN),
    )
}


def get_model_spec(name: str) -> ModelSpec:
    """Look a spec up by (case-insensitive) name; unknown names list the known ones."""
    spec = MODEL_SPECS.get(name.lower())
    if spec is None:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(sorted(MODEL_SPECS))}")
    return spec


_HF_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def spec_from_hf_config(name: str, config: dict, block_tokens: int) -> ModelSpec:
    """A served model's spec from its Hugging Face ``config.json`` (the benchmarks' local
    models): FA layers are all of them or those ``layer_types`` marks ``full_attention``,
    the others GDN layers with the ``linear_*`` geometry. KV and the conv state are in the
    dtype it is served in; the recurrent state is fp32 (SGLang's default)."""
    types = config.get("layer_types")
    layers = int(config["num_hidden_layers"])
    fa = layers if types is None else sum(t == "full_attention" for t in types)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    if dtype not in _HF_DTYPES:
        raise ValueError(f"model {name!r}: config dtype {dtype!r} not in {sorted(_HF_DTYPES)}")
    gdn: dict = {}
    if types is not None and len(types) > fa:
        gdn = dict(gdn_layers=len(types) - fa, gdn_key_heads=int(config["linear_num_key_heads"]),
                   gdn_value_heads=int(config["linear_num_value_heads"]),
                   gdn_key_head_dim=int(config["linear_key_head_dim"]),
                   gdn_value_head_dim=int(config["linear_value_head_dim"]),
                   gdn_conv_kernel=int(config["linear_conv_kernel_dim"]), gdn_conv_dtype=_HF_DTYPES[dtype])
    return ModelSpec(name, fa, int(config["num_key_value_heads"]), int(head_dim), kv_dtype=_HF_DTYPES[dtype],
                     default_block_tokens=block_tokens, **gdn)
