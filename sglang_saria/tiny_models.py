"""Build tiny random-weight models for CPU serving tests (never downloaded).

Why: CI has no model hub, and the tiers must be exercised by a real SGLang server.
A model is a transformers config + `save_pretrained` of randomly initialised weights,
seeded so every machine builds the same bytes, plus a local byte-level tokenizer with a
chat template (`sglang_saria.agents.tokenizer`), so servers start without
`--skip-tokenizer-init` and the OpenAI chat endpoint works.

The two benchmark models (`make bench-models`, not needed by the tests) are built the same
way but real-shaped: 8 KV heads per full-attention layer and at least 16 KiB of KV per token
(Qwen3-8B has 144 KiB), so a CPU prefill costs far more than reading its KV back from the
store (`saria-bench-models`), as it does on a GPU with a real model. They are float32
(32 KiB of KV per token, 512 KiB pages): CPUs without AVX-512 BF16 or AMX run bf16 GEMMs
about 300x slower than float32 ones (0.3 vs 100 GFLOP/s measured here), which would make a
benchmark of agent sessions take hours.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from sglang_saria.agents.tokenizer import build_tokenizer

FULL_ATTENTION = "qwen3-tiny"
HYBRID = "qwen3.5-tiny-hybrid"
FULL_ATTENTION_BENCH = "qwen3-bench"
HYBRID_BENCH = "qwen3.5-bench-hybrid"
KNOWN = (FULL_ATTENTION, HYBRID, FULL_ATTENTION_BENCH, HYBRID_BENCH)


def _full_attention_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )


def _hybrid_config():
    from transformers import AutoConfig

    from sglang_saria.hybrid.tiny_config import hybrid_model_config

    fields = hybrid_model_config()
    return AutoConfig.for_model(**fields), fields


def _full_attention_bench_config():
    """Qwen3 GQA with Qwen3-8B's KV heads per layer (8 x head_dim 128) but 4 layers and
    hidden 1024, so a CPU serves it: 32 KiB of float32 KV per token."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=1024,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )


def _hybrid_bench_config():
    """The tiny hybrid's fields (same model type, same 3:1 GDN/full-attention layer types),
    scaled up: 8 layers (6 GDN, 2 full attention) with 8 KV heads x head_dim 256 (Qwen3.5's
    head_dim) = 32 KiB of float32 KV per token, and GDN heads of 128 as Qwen3-Next's."""
    from transformers import AutoConfig

    from sglang_saria.hybrid.tiny_config import FULL_ATTENTION_INTERVAL, hybrid_model_config

    layers = 8
    fields = hybrid_model_config() | {
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": layers,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "max_position_embeddings": 32768,
        "torch_dtype": "float32",
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 8,
        "linear_num_value_heads": 16,
        "layer_types": [
            "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention" for i in range(layers)
        ],
    }
    return AutoConfig.for_model(**fields), fields


@dataclass(frozen=True)
class GDNGeometry:
    """A hybrid's GDN layers: what one prefix checkpoint (a stored MAMBA sidecar object) holds,
    as SGLang's mamba pool keeps it: the fp32 recurrent state [value heads, V, K] and the last
    `conv_width` conv inputs (in the model's dtype) of every GDN layer."""

    layers: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_dim: int
    conv_width: int
    dtype_bytes: int = 2

    @property
    def state_bytes(self) -> int:
        recurrent = self.value_heads * self.value_dim * self.key_dim * 4
        return self.layers * (recurrent + self.conv_dim * self.conv_width * self.dtype_bytes)


@dataclass(frozen=True)
class KVGeometry:
    """What a model's KV costs to store: its full-attention layers' K and V per token (the
    store's pages hold exactly these bytes; GDN layers keep a state, not per-token KV)."""

    fa_layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # the model's dtype: bf16 / fp16 2, float32 4
    gdn: GDNGeometry | None = None

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.fa_layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def page_bytes(self, page_size: int = 16) -> int:
        return page_size * self.bytes_per_token


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def config_dtype(config: dict) -> str:
    """The dtype a model is saved in and served in (`--dtype` of the benchmarks' servers)."""
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"config dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    return dtype


def model_dtype(model_dir: Path) -> str:
    """`config_dtype` of a saved model."""
    return config_dtype(json.loads((Path(model_dir) / "config.json").read_text()))


def _dtype_bytes(config: dict) -> int:
    """Bytes per KV element."""
    return DTYPE_BYTES[config_dtype(config)]


def _gdn_geometry(config: dict, gdn_layers: int) -> GDNGeometry:
    key_heads, key_dim = config["linear_num_key_heads"], config["linear_key_head_dim"]
    value_heads, value_dim = config["linear_num_value_heads"], config["linear_value_head_dim"]
    return GDNGeometry(
        layers=gdn_layers,
        value_heads=value_heads,
        key_dim=key_dim,
        value_dim=value_dim,
        conv_dim=2 * key_heads * key_dim + value_heads * value_dim,
        conv_width=config["linear_conv_kernel_dim"] - 1,
        dtype_bytes=_dtype_bytes(config),
    )


def geometry_of(config: dict) -> KVGeometry:
    """The KV geometry of a config dict: full-attention layers are all of them, or those a
    hybrid's `layer_types` mark so (the others are GDN layers)."""
    types = config.get("layer_types")
    fa_layers = int(config["num_hidden_layers"]) if types is None else sum(t == "full_attention" for t in types)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    gdn = _gdn_geometry(config, len(types) - fa_layers) if types and len(types) > fa_layers else None
    return KVGeometry(fa_layers, int(config["num_key_value_heads"]), int(head_dim), _dtype_bytes(config), gdn)


def kv_geometry(model_dir: Path) -> KVGeometry:
    """The KV geometry of a saved model (its config.json), e.g. for the benchmarks' `--model`."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} has no config.json (build it: make bench-models)")
    return geometry_of(json.loads(path.read_text()))


def bench_config(name: str) -> dict:
    """The config.json fields of a benchmark model, without building its weights (tests)."""
    if name == FULL_ATTENTION_BENCH:
        return _full_attention_bench_config().to_dict()
    if name == HYBRID_BENCH:
        config, extra = _hybrid_bench_config()
        return {**extra, **config.to_dict()}
    raise ValueError(f"{name!r} is not a benchmark model ({FULL_ATTENTION_BENCH}, {HYBRID_BENCH})")


def build(name: str, out_dir: Path, seed: int = 0, rewrite_tokenizer: bool = False) -> Path:
    """Write `name` under out_dir/name: weights only when config.json is missing; the
    tokenizer when missing or when `rewrite_tokenizer` (it takes milliseconds)."""
    target = out_dir / name
    if not (target / "config.json").exists() or _stale_dtype(name, target):
        _build_weights(name, target, seed)
    if rewrite_tokenizer or not (target / "tokenizer.json").exists():
        build_tokenizer(target)
    return target


def _stale_dtype(name: str, target: Path) -> bool:
    """A benchmark model saved in another dtype than its builder's (bf16 before float32)."""
    if name not in (FULL_ATTENTION_BENCH, HYBRID_BENCH):
        return False
    saved = json.loads((target / "config.json").read_text())
    return _dtype_bytes(saved) != _dtype_bytes(bench_config(name))


def _build_weights(name: str, target: Path, seed: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    extra: dict = {}
    if name == FULL_ATTENTION:
        config = _full_attention_config()
    elif name == HYBRID:
        config, extra = _hybrid_config()
    elif name == FULL_ATTENTION_BENCH:
        config = _full_attention_bench_config()
    elif name == HYBRID_BENCH:
        config, extra = _hybrid_bench_config()
    else:
        raise SystemExit(f"error: unknown model {name!r}; known: {', '.join(KNOWN)}")
    bench = name in (FULL_ATTENTION_BENCH, HYBRID_BENCH)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32 if bench else torch.bfloat16)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    # save_pretrained drops fields SGLang 0.5.23 still reads (e.g. full_attention_interval).
    saved = json.loads((target / "config.json").read_text())
    saved.update({k: v for k, v in extra.items() if k not in saved})
    (target / "config.json").write_text(json.dumps(saved, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="saria-make-tiny-models", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models"), help="output folder (default: models/)")
    parser.add_argument("names", nargs="*", default=[FULL_ATTENTION], choices=KNOWN, help=", ".join(KNOWN))
    args = parser.parse_args(argv)
    for name in args.names:
        print(build(name, args.out, rewrite_tokenizer=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
