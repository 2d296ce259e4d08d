#!/usr/bin/env python
"""Build tiny random-weight models for CPU serving tests (never downloaded).

Why: CI has no model hub, and the tiers must be exercised by a real SGLang server.
A model is a transformers config + `save_pretrained` of randomly initialised weights,
seeded so every machine builds the same bytes, plus a local byte-level tokenizer with a
chat template (`sglang_saria.agents.tokenizer`), so servers start without
`--skip-tokenizer-init` and the OpenAI chat endpoint works.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglang_saria.agents.tokenizer import build_tokenizer

FULL_ATTENTION = "qwen3-tiny"
HYBRID = "qwen3.5-tiny-hybrid"


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


def build(name: str, out_dir: Path, seed: int = 0, rewrite_tokenizer: bool = False) -> Path:
    """Write `name` under out_dir/name: weights only when config.json is missing; the
    tokenizer when missing or when `rewrite_tokenizer` (it takes milliseconds)."""
    target = out_dir / name
    if not (target / "config.json").exists():
        _build_weights(name, target, seed)
    if rewrite_tokenizer or not (target / "tokenizer.json").exists():
        build_tokenizer(target)
    return target


def _build_weights(name: str, target: Path, seed: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    extra: dict = {}
    if name == FULL_ATTENTION:
        config = _full_attention_config()
    elif name == HYBRID:
        config, extra = _hybrid_config()
    else:
        raise SystemExit(f"error: unknown tiny model {name!r}; known: {FULL_ATTENTION}, {HYBRID}")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    # save_pretrained drops fields SGLang 0.5.23 still reads (e.g. full_attention_interval).
    saved = json.loads((target / "config.json").read_text())
    saved.update({k: v for k, v in extra.items() if k not in saved})
    (target / "config.json").write_text(json.dumps(saved, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models"), help="output folder (default: models/)")
    parser.add_argument("names", nargs="*", default=[FULL_ATTENTION], help=f"{FULL_ATTENTION} and/or {HYBRID}")
    args = parser.parse_args(argv)
    for name in args.names:
        print(build(name, args.out, rewrite_tokenizer=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
