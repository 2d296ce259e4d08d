"""Why the cached-vs-cold logprob oracle has the tolerance it has, measured on the tiny models.

`LOGPROB_TOLERANCE` (1e-2) must sit above the legitimate spread (stock SGLang, cached vs
cold prefill on some CPUs: up to 3.9e-3) and below what wrong KV does. Here transformers
runs the same weights in fp32 (no server, no shape-dependent kernels): 4 greedy tokens of
a prompt computed cold, then continued from a 288-token prefix cache that is intact or
corrupted as a broken reload would corrupt it, compared as `launcher.logprob_diff` does.

Measured (max |logprob difference|; * = greedy tokens changed):
| cache | qwen3-tiny | qwen3.5-tiny-hybrid |
|---|---|---|
| intact | 4.8e-7 | 4.8e-7 |
| all pages zeroed | 9.4e-2 * | 1.6e-1 * |
| every page holds its predecessor's KV | 1.5e-1 * | 6.0e-3 |
| one page of 18 zeroed | 1.7e-2 | 3.1e-3 |
| GDN states zeroed | - | 2.3e-4 |

So the tolerance catches gross errors on the FA model, but on the random hybrid (one FA
layer of four, states that barely matter) wrong KV can hide inside it: logprobs are no
proof that moved KV is right. The byte-level KV audit (audit/kv.py) is that proof.
"""

from __future__ import annotations

import pytest
import torch

from sglang_saria.launcher import LOGPROB_TOLERANCE, LogprobDiff, logprob_diff

PROMPT = list(range(1, 301)) + [7, 8, 9] * 10
CACHED = 288  # the reused prefix: 18 pages of 16 tokens
PAGE = 16
STEPS = 4  # output tokens, as the e2e tests request
STOCK_SPREAD = 3.9e-3  # measured: stock SGLang, cached vs cold, on one CPU machine


def corrupt(cache, how: str) -> None:
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if how == "zero_gdn_states":
            for states in (getattr(layer, "conv_states", None), getattr(layer, "recurrent_states", None)):
                for state in (states or {}).values():
                    state.zero_()
        if not torch.is_tensor(keys) or not keys.numel():
            continue
        for kv in (layer.keys, layer.values):  # [batch, heads, tokens, dim]
            if how == "zero":
                kv.zero_()
            elif how == "pages_shifted":  # each page holds its predecessor's KV
                kv[..., PAGE:, :] = kv[..., :-PAGE, :].clone()
            elif how == "one_page_zero":
                kv[..., 8 * PAGE : 9 * PAGE, :] = 0


def trace(model, cache=None) -> list:
    """Greedy output as the server reports it (`launcher.logprob_trace`): per step the
    token's [logprob, id] and its top-5 alternatives; cold, or continued from ``cache``."""
    ids = torch.tensor([PROMPT])
    tokens, tops = [], []
    with torch.no_grad():
        if cache is None:
            out = model(ids, use_cache=True)
        else:
            out = model(ids[:, CACHED:], past_key_values=cache, use_cache=True)
        for _ in range(STEPS):
            row = torch.log_softmax(out.logits[0, -1].float(), -1)
            best = row.topk(5)
            tokens.append([float(best.values[0]), int(best.indices[0])])
            tops.append([[float(v), int(i)] for v, i in zip(best.values, best.indices)])
            out = model(best.indices[:1].view(1, 1), past_key_values=out.past_key_values, use_cache=True)
    return [tokens, tops]


def diff(model, how: str | None, cold: list) -> LogprobDiff:
    """The oracle's comparison of a run continued from the (corrupted) prefix cache with cold."""
    with torch.no_grad():
        cache = model(torch.tensor([PROMPT[:CACHED]]), use_cache=True).past_key_values
    if how is not None:
        corrupt(cache, how)
    return logprob_diff(trace(model, cache), cold)


@pytest.fixture(scope="module")
def runs(request):
    """``runs(model_fixture)``: (model, its cold trace), loaded once per module."""
    from transformers import AutoModelForCausalLM

    loaded = {}

    def get(name: str):
        if name not in loaded:
            path = request.getfixturevalue(name)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            loaded[name] = (model, trace(model))
        return loaded[name]

    return get


def test_tolerance_sits_above_the_stock_spread():
    assert 2 * STOCK_SPREAD <= LOGPROB_TOLERANCE


@pytest.mark.parametrize("model", ["tiny_model", "hybrid_model"])
def test_an_intact_prefix_cache_stays_far_inside_the_tolerance(runs, model):
    model_, cold = runs(model)
    d = diff(model_, None, cold)
    assert d.same_tokens and d.max_abs < LOGPROB_TOLERANCE / 10


@pytest.mark.parametrize(
    "model, how",
    [("tiny_model", "zero"), ("tiny_model", "pages_shifted"), ("tiny_model", "one_page_zero"), ("hybrid_model", "zero")],
)
def test_wrong_kv_fails_the_oracle(runs, model, how):
    model_, cold = runs(model)
    d = diff(model_, how, cold)
    assert not d.within(LOGPROB_TOLERANCE), f"{model} {how}: {d}"


@pytest.mark.parametrize("how", ["pages_shifted", "one_page_zero", "zero_gdn_states"])
def test_on_the_hybrid_some_wrong_kv_hides_inside_the_tolerance_so_the_kv_audit_is_the_oracle(runs, how):
    """Measured: the random hybrid's output barely depends on its one FA layer's pages and
    on its GDN states (shifted pages 6e-3, zeroed states 2e-4). Such KV is wrong all the
    same, which the byte-level audit catches (tests/hicache/test_kv_audit.py)."""
    model, cold = runs("hybrid_model")
    intact, d = diff(model, None, cold), diff(model, how, cold)
    assert d.max_abs > 100 * intact.max_abs, f"{how} changed nothing measurable: {d}"
