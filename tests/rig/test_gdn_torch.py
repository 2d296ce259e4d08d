"""saria_cpu_rig.gdn_torch against transformers 5.19's Qwen3.5 reference code.

Tolerances per dtype: both sides compute in fp32 from the same rounded inputs, so
they differ by accumulation order inside fp32 (about 1e-6 relative, bounded here at
2e-5 for outputs that pass through a triangular solve over a 64-token chunk) plus
the final rounding to the output dtype: at most a couple of ulps of that dtype
(fp16 ulp 2^-10, bf16 ulp 2^-7 relative). Reference functions that round twice
(gated RMSNorm rounds after the norm and after the gate) get one more ulp.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5 import modeling_qwen3_5 as ref

from saria_cpu_rig import gdn_torch as gt

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (rtol, atol) for outputs rounded once to the dtype.
TOL = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2 * 2**-10, 2e-3),
    torch.bfloat16: (2 * 2**-7, 1.6e-2),
}
H, HV, DK, DV = 2, 4, 16, 16  # GQA ratio 2, like the tiny hybrid model


def _close(actual, expected, dtype, ulps: int = 1):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), rtol=rtol * ulps,
                               atol=atol * ulps)


def _qkv(T, dtype, seed=0, batch=1):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, T, H, DK, generator=gen).to(dtype)
    k = torch.randn(batch, T, H, DK, generator=gen).to(dtype)
    v = torch.randn(batch, T, HV, DV, generator=gen).to(dtype)
    a = torch.randn(batch, T, HV, generator=gen).to(dtype)
    b = torch.randn(batch, T, HV, generator=gen).to(dtype)
    A_log = torch.log(torch.empty(HV).uniform_(0.5, 8, generator=gen))
    dt_bias = torch.randn(HV, generator=gen)
    return q, k, v, a, b, A_log, dt_bias


def _ref_gates(a, b, A_log, dt_bias):
    """transformers' Qwen3_5GatedDeltaNet.forward gating lines."""
    beta = b.sigmoid()
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, beta


def _ref_rule(q, k, v, g, beta, state_kv, chunked=True):
    rep = HV // H
    qr, kr = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    fn = ref.torch_chunk_gated_delta_rule if chunked else ref.torch_recurrent_gated_delta_rule
    return fn(qr, kr, v, g=g, beta=beta, initial_state=state_kv, output_final_state=True,
              use_qk_l2norm_in_kernel=True)


# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("T", [1, 37, 64, 150])
def test_chunk_rule_matches_transformers(dtype, with_state, T):
    q, k, v, a, b, A_log, dt_bias = _qkv(T, dtype, seed=T)
    g_ref, beta_ref = _ref_gates(a, b, A_log, dt_bias)
    g, beta = gt.fused_gdn_gating(A_log, a[0], b[0], dt_bias)
    torch.testing.assert_close(g, g_ref.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(beta, beta_ref.float(), rtol=0, atol=0)

    state_kv = torch.randn(1, HV, DK, DV) * 0.5 if with_state else None
    o_ref, final_ref = _ref_rule(q, k, v, g_ref, beta_ref, state_kv)
    pool = torch.zeros(3, HV, DV, DK)  # SGLang pool layout [slots, HV, V, K]
    if with_state:
        pool[2] = state_kv[0].transpose(-1, -2)
    cu = torch.tensor([0, T])
    o, none, h = gt.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=pool, initial_state_indices=torch.tensor([2]),
        cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    assert none is None and o.dtype == dtype
    _close(o, o_ref, dtype)
    torch.testing.assert_close(pool[2].transpose(-1, -2), final_ref[0], rtol=2e-5, atol=2e-5)
    assert h.shape == (1, (T + 63) // 64, HV, DV, DK)
    # h[n] is the state after n*64 tokens: compare with the reference on that prefix.
    for n in range(1, h.shape[1]):
        _, prefix_final = _ref_rule(q[:, : 64 * n], k[:, : 64 * n], v[:, : 64 * n],
                                    g_ref[:, : 64 * n], beta_ref[:, : 64 * n], state_kv)
        torch.testing.assert_close(h[0, n].transpose(-1, -2), prefix_final[0],
                                   rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunk_rule_varlen_and_padding_slot(dtype):
    """Sequences in one varlen batch equal separate reference runs; a padding slot
    (-1) starts from a zero state and writes nothing back (as SGLang's FLA kernel)."""
    lens = [70, 5, 9]
    q, k, v, a, b, A_log, dt_bias = _qkv(sum(lens), dtype, seed=7)
    g, beta = gt.fused_gdn_gating(A_log, a[0], b[0], dt_bias)
    pool = torch.randn(4, HV, DV, DK) * 0.3
    before = pool.clone()
    cu = torch.tensor([0, 70, 75, 84])
    o, _, h = gt.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=pool, initial_state_indices=torch.tensor([1, -1, 3]),
        cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    assert h.shape[1] == 2 + 1 + 1
    g_ref, beta_ref = _ref_gates(a, b, A_log, dt_bias)
    for slot, (s, e) in ((1, (0, 70)), (-1, (70, 75)), (3, (75, 84))):
        init = None if slot < 0 else before[slot : slot + 1].transpose(-1, -2)
        o_ref, final_ref = _ref_rule(q[:, s:e], k[:, s:e], v[:, s:e], g_ref[:, s:e],
                                     beta_ref[:, s:e], init)
        _close(o[:, s:e], o_ref, dtype)
        if slot >= 0:
            torch.testing.assert_close(pool[slot].transpose(-1, -2), final_ref[0],
                                       rtol=2e-5, atol=2e-5)
    assert torch.equal(pool[0], before[0]) and torch.equal(pool[2], before[2])


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunk_rule_resumes_bit_exact_from_checkpoint(dtype):
    """A prefill resumed from the chunk-aligned checkpoint h[n] (what SGLang's prefix
    cache stores) reproduces the cold prefill exactly: cached logprobs can equal a
    cold run."""
    T = 200
    q, k, v, a, b, A_log, dt_bias = _qkv(T, dtype, seed=3)
    g, beta = gt.fused_gdn_gating(A_log, a[0], b[0], dt_bias)
    pool = torch.zeros(2, HV, DV, DK)
    o_cold, _, h = gt.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=pool, initial_state_indices=torch.tensor([0]),
        cu_seqlens=torch.tensor([0, T]), use_qk_l2norm_in_kernel=True)
    pool[1] = h[0, 2]
    o_warm, _, _ = gt.chunk_gated_delta_rule(
        q[:, 128:], k[:, 128:], v[:, 128:], g[:, 128:], beta[:, 128:], initial_state=pool,
        initial_state_indices=torch.tensor([1]), cu_seqlens=torch.tensor([0, T - 128]),
        use_qk_l2norm_in_kernel=True)
    assert torch.equal(o_warm, o_cold[:, 128:])
    assert torch.equal(pool[1], pool[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_state", [False, True])
def test_recurrent_decode_matches_transformers(dtype, with_state):
    batch = 3
    q, k, v, a, b, A_log, dt_bias = _qkv(1, dtype, seed=11, batch=batch)
    g_ref, _ = _ref_gates(a, b, A_log, dt_bias)
    # SGLang's fused decode kernel takes sigmoid(b) in fp32 without rounding it to
    # b's dtype (the prefill gating does round), so the reference gets the same beta.
    beta_ref = torch.sigmoid(b.float())
    state_kv = torch.randn(batch, HV, DK, DV) * 0.5 if with_state else torch.zeros(batch, HV, DK, DV)
    o_ref, final_ref = _ref_rule(q, k, v, g_ref, beta_ref, state_kv, chunked=False)
    pool = torch.zeros(6, HV, DV, DK)
    slots = torch.tensor([4, -1, 1, 2])  # padded batch row 1
    rows = [0, 2, 3]
    for i, r in enumerate(rows):
        pool[slots[r]] = state_kv[i].transpose(-1, -2)
    flat = lambda t: t.reshape(1, batch, *t.shape[2:])  # noqa: E731 - [B,1,...] -> [1,B,...]
    pad = lambda t: torch.cat([t[:, :1], torch.zeros_like(t[:, :1]), t[:, 1:]], 1)  # noqa: E731
    o = gt.fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=pad(flat(a))[0], dt_bias=dt_bias, softplus_beta=1.0,
        softplus_threshold=20.0, q=pad(flat(q)), k=pad(flat(k)), v=pad(flat(v)),
        b=pad(flat(b))[0], initial_state_source=pool, initial_state_indices=slots,
        cu_seqlens=torch.arange(batch + 2), use_qk_l2norm_in_kernel=True)
    _close(o[0, rows], o_ref[:, 0], dtype)
    assert torch.count_nonzero(o[0, 1]) == 0
    for i, r in enumerate(rows):
        torch.testing.assert_close(pool[slots[r]].transpose(-1, -2), final_ref[i],
                                   rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_state", [False, True])
def test_conv_prefill_matches_transformers(dtype, with_state):
    dim, width = 24, 4
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(dim, width, generator=gen).to(dtype)
    lens = [9, 2]
    x = torch.randn(dim, sum(lens), generator=gen).to(dtype)
    states = torch.randn(3, dim, width - 1, generator=gen).to(dtype)
    before = states.clone()
    out = gt.causal_conv1d_fn(
        x, weight, None, conv_states=states, query_start_loc=torch.tensor([0, 9, 11]),
        seq_lens_cpu=lens, cache_indices=torch.tensor([2, 0]),
        has_initial_state=torch.tensor([with_state, with_state]), activation="silu")
    for slot, (s, e) in ((2, (0, 9)), (0, (9, 11))):
        seq = x[:, s:e].unsqueeze(0)
        if with_state:
            ref_state = before[slot : slot + 1].clone()
            expected = ref.causal_conv1d_update(seq, ref_state, weight, None, "silu")
        else:
            expected = ref.causal_conv1d_fn(seq, weight, None, activation="silu")
            ref_state = F.pad(seq, (width - 1, 0))[:, :, -(width - 1):]
        _close(out[:, s:e], expected[0], dtype)
        assert torch.equal(states[slot], ref_state[0])
    assert torch.equal(states[1], before[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_decode_matches_transformers(dtype):
    dim, width, batch = 24, 4, 3
    gen = torch.Generator().manual_seed(9)
    weight = torch.randn(dim, width, generator=gen).to(dtype)
    bias = torch.randn(dim, generator=gen).to(dtype)
    x = torch.randn(batch, dim, generator=gen).to(dtype)
    pool = torch.randn(5, dim, width - 1, generator=gen).to(dtype)
    slots = torch.tensor([3, 0, 4])
    ref_state = pool[slots].clone()
    expected = ref.causal_conv1d_update(x.unsqueeze(-1), ref_state, weight, bias, "silu")
    out = gt.causal_conv1d_update(x, pool, weight, bias, "silu", conv_state_indices=slots)
    _close(out, expected[..., 0], dtype)
    assert torch.equal(pool[slots], ref_state)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_rmsnorm_matches_transformers(dtype):
    gen = torch.Generator().manual_seed(2)
    norm = ref.Qwen3_5RMSNormGated(DV, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(DV, generator=gen) * 0.5 + 1)
    x = torch.randn(40, DV, generator=gen).to(dtype)
    z = torch.randn(40, DV, generator=gen).to(dtype)
    expected = norm(x, z)
    got = gt.gated_rms_norm(x, norm.weight, z, eps=1e-6, activation="swish")
    assert got.dtype == dtype
    _close(got, expected, dtype, ulps=2)  # the reference rounds twice


def test_split_qkvzba_matches_separate_projections():
    """Qwen3.5 checkpoints have in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; SGLang
    merges them as [qkv|z] and [b|a]; the split must give back each projection."""
    gen = torch.Generator().manual_seed(4)
    hidden, T = 32, 6
    qkv_w = torch.randn(2 * H * DK + HV * DV, hidden, generator=gen)
    z_w, b_w, a_w = (torch.randn(n, hidden, generator=gen) for n in (HV * DV, HV, HV))
    x = torch.randn(T, hidden, generator=gen)
    mixed_qkv, z, b, a = gt.split_qkvzba_contiguous(
        x @ torch.cat([qkv_w, z_w]).T, x @ torch.cat([b_w, a_w]).T, H, HV, DK, DV)
    torch.testing.assert_close(mixed_qkv, x @ qkv_w.T)
    torch.testing.assert_close(z, (x @ z_w.T).reshape(T, HV, DV))
    torch.testing.assert_close(b, x @ b_w.T)
    torch.testing.assert_close(a, x @ a_w.T)
    with pytest.raises(ValueError, match="qkvz width"):
        gt.split_qkvzba_contiguous(x @ qkv_w.T, x @ torch.cat([b_w, a_w]).T, H, HV, DK, DV)


def test_track_mamba_states_copies_masked_rows():
    conv = torch.randn(2, 6, 3, 2)  # [layers, slots, dim, w-1]
    ssm = torch.randn(2, 6, 2, 2, 2)
    conv0, ssm0 = conv.clone(), ssm.clone()
    gt.track_mamba_states(conv, ssm, torch.tensor([0, 1, 2]), torch.tensor([True, False, True]),
                          torch.tensor([4, 5, -1]), 3, check_freed_slots=True, all_layers=True)
    assert torch.equal(conv[:, 4], conv0[:, 0]) and torch.equal(ssm[:, 4], ssm0[:, 0])
    assert torch.equal(conv[:, 5], conv0[:, 5])  # row 1 not tracked
    assert torch.equal(conv[:, :4], conv0[:, :4])  # freed slot (-1) skipped


@pytest.mark.parametrize("dtype", DTYPES)
def test_output_gate_matches_transformers(dtype):
    """Qwen3_5Attention.forward: attn_output * sigmoid(gate); SGLang hands the gate as a
    strided [T, heads, dim] view of the chunked q projection."""
    gen = torch.Generator().manual_seed(8)
    tokens, heads, dim = 7, 4, 16
    q_gate = torch.randn(tokens, heads, 2 * dim, generator=gen).to(dtype)
    _, gate = torch.chunk(q_gate, 2, dim=-1)  # strided view, as in forward_prepare_native
    attn = torch.randn(tokens, heads * dim, generator=gen).to(dtype)
    expected = attn * torch.sigmoid(gate.reshape(tokens, -1))
    got = gt.sigmoid_mul(attn.clone(), gate, inplace=False)
    _close(got, expected, dtype)
    inplace = attn.clone()
    assert gt.sigmoid_mul(inplace, gate, inplace=True) is inplace
    assert torch.equal(inplace, got)


@pytest.mark.parametrize("platform", ["is_cuda", "is_hip", "is_npu", "is_xpu", "is_cpu"])
def test_torch_gdn_route_only_on_plain_cpu(monkeypatch, platform):
    """The patched SGLang modules take the torch ops only where SGLang sees no
    accelerator and no sgl_kernel CPU engine (is_cpu() means SGLANG_USE_CPU_ENGINE=1):
    any of those platforms keeps its own kernels, so GPU paths are unchanged."""
    import sglang.srt.utils as sglang_utils

    from saria_cpu_rig.cpu_route import use_torch_gdn

    for name in ("is_cuda", "is_hip", "is_npu", "is_xpu", "is_cpu"):
        monkeypatch.setattr(sglang_utils, name, lambda: False)
    assert use_torch_gdn.__wrapped__() is True
    monkeypatch.setattr(sglang_utils, platform, lambda: True)
    assert use_torch_gdn.__wrapped__() is False


def _sglang_style_gdn_layer(layer, x, conv_pool, ssm_pool, slot, decode: bool):
    """The Qwen3.5 GDN layer as SGLang runs it on plain CPU (merged projections, the
    pool-based conv/SSM states, the torch ops), built from transformers' weights."""
    dims = (layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim)
    qkvz = x @ torch.cat([layer.in_proj_qkv.weight, layer.in_proj_z.weight]).T
    ba = x @ torch.cat([layer.in_proj_b.weight, layer.in_proj_a.weight]).T
    mixed_qkv, z, b, a = gt.split_qkvzba_contiguous(qkvz, ba, dims[0], dims[1], dims[2], dims[3])
    weight = layer.conv1d.weight.squeeze(1)
    slots = torch.tensor([slot])
    tokens = x.shape[0]
    if decode:
        mixed_qkv = gt.causal_conv1d_update(mixed_qkv, conv_pool, weight, None, "silu",
                                            conv_state_indices=slots)
    else:
        mixed_qkv = gt.causal_conv1d_fn(mixed_qkv.T, weight, None, conv_pool,
                                        torch.tensor([0, tokens]), [tokens], slots,
                                        torch.tensor([False]), activation="silu").T
    q, k, v = torch.split(mixed_qkv, [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    q, k = (t.reshape(1, tokens, dims[0], dims[2]) for t in (q, k))
    v = v.reshape(1, tokens, dims[1], dims[3])
    if decode:
        o = gt.fused_sigmoid_gating_delta_rule_update(
            layer.A_log, a, layer.dt_bias, 1.0, 20.0, q, k, v, b, ssm_pool, slots,
            cu_seqlens=torch.tensor([0, 1]), use_qk_l2norm_in_kernel=True)
    else:
        g, beta = gt.fused_gdn_gating(layer.A_log, a, b, layer.dt_bias)
        o, _, _ = gt.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=ssm_pool,
                                            initial_state_indices=slots,
                                            cu_seqlens=torch.tensor([0, tokens]),
                                            use_qk_l2norm_in_kernel=True)
    y = gt.gated_rms_norm(o.reshape(-1, dims[3]), layer.norm.weight, z.reshape(-1, dims[3]),
                          layer.norm.variance_epsilon, activation="silu")
    return y.reshape(tokens, -1) @ layer.out_proj.weight.T


@pytest.mark.parametrize("dtype", DTYPES)
def test_whole_gdn_layer_prefill_then_decode_matches_transformers(dtype):
    """transformers' Qwen3_5GatedDeltaNet on the whole sequence vs the SGLang-style layer:
    prefill of the first 100 tokens, then two decode steps resuming from the pool states
    (conv and SSM state written by the prefill). Same per-dtype tolerance as the ops: the
    projections round identically on both sides, the recurrences stay in fp32."""
    from transformers import AutoConfig

    from sglang_saria.hybrid.tiny_config import hybrid_model_config

    torch.manual_seed(0)
    config = AutoConfig.for_model(**hybrid_model_config())
    layer = ref.Qwen3_5GatedDeltaNet(config, layer_idx=0).to(dtype).eval()
    x = (torch.randn(102, config.hidden_size) * 0.5).to(dtype)
    with torch.no_grad():
        expected = layer(x.unsqueeze(0))[0]
        conv_pool = torch.zeros(2, layer.conv_dim, config.linear_conv_kernel_dim - 1, dtype=dtype)
        ssm_pool = torch.zeros(2, layer.num_v_heads, layer.head_v_dim, layer.head_k_dim)
        got = [_sglang_style_gdn_layer(layer, x[:100], conv_pool, ssm_pool, 1, decode=False)]
        for t in (100, 101):
            got.append(_sglang_style_gdn_layer(layer, x[t : t + 1], conv_pool, ssm_pool, 1,
                                               decode=True))
    _close(torch.cat(got), expected, dtype, ulps=1)
