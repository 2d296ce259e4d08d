"""Pure-torch CPU implementations of the Gated DeltaNet (GDN) pieces SGLang's
Qwen3.5 / Qwen3-Next linear-attention layer runs.

WHY: on a CPU-only host SGLang 0.5.23 reaches Triton kernels (fla ops, the fused
projection split, causal conv1d, gating, gated RMSNorm, state tracking) that need a
GPU driver, or ``sgl_kernel`` CPU ops that the package index does not ship. These
functions have the same signatures and state layouts as the SGLang ops they stand
in for (see the patches in ``patches/sglang-0.5.23/02x-*``), so the serving path
runs without Triton. They are checked against transformers' reference
implementations in ``tests/hybrid``.

Layouts (as in SGLang's mamba pool):
- conv state pool: ``[slots, dim, width - 1]``, the last ``width - 1`` raw inputs,
  oldest first;
- SSM state pool: ``[slots, HV, V, K]`` (value-major, the transpose of
  transformers' ``[B, HV, K, V]``).

All recurrences run in fp32; the chunked rule keeps the per-chunk arithmetic
independent of where the sequence starts, so a prefill resumed from a chunk-aligned
checkpoint reproduces a cold prefill bit for bit.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64  # SGLang's FLA chunk size; also the mamba state-tracking grid.
PAD_SLOT_ID = -1


# --------------------------------------------------------------------------- #
# Fused projection split
# --------------------------------------------------------------------------- #
def split_qkvzba_contiguous(
    mixed_qkvz: torch.Tensor,
    mixed_ba: torch.Tensor,
    num_heads_qk: int,
    num_heads_v: int,
    head_qk: int,
    head_v: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split Qwen3.5's merged projections ``[q|k|v|z]`` and ``[b|a]``.

    Returns ``mixed_qkv [T, 2*H*Dk + HV*Dv]`` (contiguous, the conv input),
    ``z [T, HV, Dv]``, ``b [T, HV]``, ``a [T, HV]`` like SGLang's
    ``fused_qkvzba_split_reshape_cat_contiguous``.
    """
    qkv_dim = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    expected = qkv_dim + num_heads_v * head_v
    if mixed_qkvz.shape[-1] != expected or mixed_ba.shape[-1] != 2 * num_heads_v:
        raise ValueError(
            f"split_qkvzba_contiguous: qkvz width {mixed_qkvz.shape[-1]} (want {expected})"
            f" / ba width {mixed_ba.shape[-1]} (want {2 * num_heads_v})"
        )
    tokens = mixed_qkvz.shape[0]
    mixed_qkv = mixed_qkvz[:, :qkv_dim].contiguous()
    z = mixed_qkvz[:, qkv_dim:].reshape(tokens, num_heads_v, head_v).contiguous()
    b = mixed_ba[:, :num_heads_v].contiguous()
    a = mixed_ba[:, num_heads_v:].contiguous()
    return mixed_qkv, z, b, a


# --------------------------------------------------------------------------- #
# Causal depthwise conv1d
# --------------------------------------------------------------------------- #
def _activate(x: torch.Tensor, activation) -> torch.Tensor:
    if activation is None or activation is False:
        return x
    if activation is True or activation in ("silu", "swish"):
        return F.silu(x)
    raise ValueError(f"causal conv1d: unsupported activation {activation!r}")


def _conv_window(
    window: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]
) -> torch.Tensor:
    """Depthwise causal conv over ``window [dim, width-1+T]`` -> ``[dim, T]`` (fp32).

    Taps are summed in a fixed order so an output only depends on its own window,
    not on the sequence length (keeps resumed prefills bit-identical).
    """
    width = weight.shape[-1]
    steps = window.shape[-1] - width + 1
    w = weight.float()
    out = window[:, 0:steps].float() * w[:, 0:1]
    for j in range(1, width):
        out = out + window[:, j : j + steps].float() * w[:, j : j + 1]
    if bias is not None:
        out = out + bias.float()[:, None]
    return out


def _check_conv_state(caller: str, state: torch.Tensor, dim: int, state_len: int) -> None:
    if state.shape[-2:] != (dim, state_len):
        raise ValueError(f"{caller}: conv state {tuple(state.shape)} does not end in (dim={dim}, width-1={state_len})")


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    conv_states: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens_cpu: Optional[Sequence[int]] = None,
    cache_indices: Optional[torch.Tensor] = None,
    has_initial_state: Optional[torch.Tensor] = None,
    activation: Optional[str] = "silu",
    pad_slot_id: int = PAD_SLOT_ID,
    **kwargs,
) -> torch.Tensor:
    """Varlen prefill conv: ``x [dim, total_tokens]`` -> same shape.

    Sequence ``i`` spans ``query_start_loc[i]:query_start_loc[i+1]``; it starts from
    ``conv_states[cache_indices[i]]`` when ``has_initial_state[i]`` (else zeros) and
    leaves its last ``width - 1`` inputs there. Rows whose slot is ``pad_slot_id``
    are skipped (output zeros), as in SGLang's kernel.
    """
    dim, _ = x.shape
    width = weight.shape[-1]
    state_len = width - 1
    _check_conv_state("causal_conv1d_fn", conv_states, dim, state_len)
    starts = query_start_loc.tolist()
    out = torch.zeros_like(x)
    for i in range(len(starts) - 1):
        begin, end = starts[i], starts[i + 1]
        slot = i if cache_indices is None else int(cache_indices[i])
        if slot == pad_slot_id or end == begin:
            continue
        if has_initial_state is not None and bool(has_initial_state[i]):
            prev = conv_states[slot].to(x.dtype)
        else:
            prev = x.new_zeros(dim, state_len)
        window = torch.cat([prev, x[:, begin:end]], dim=-1)
        y = _activate(_conv_window(window, weight, bias), activation)
        out[:, begin:end] = y.to(x.dtype)
        conv_states[slot] = window[:, -state_len:].to(conv_states.dtype)
    return out


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation=None,
    cache_seqlens: Optional[torch.Tensor] = None,
    conv_state_indices: Optional[torch.Tensor] = None,
    pad_slot_id: int = PAD_SLOT_ID,
    **kwargs,
) -> torch.Tensor:
    """Decode conv step(s): ``x [B, dim]`` or ``[B, dim, T]``; shifts each state in place."""
    if cache_seqlens is not None or kwargs.get("intermediate_conv_window") is not None:
        raise NotImplementedError(
            "causal_conv1d_update (torch CPU): circular buffers and speculative "
            "intermediate windows are not supported"
        )
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    batch, dim, _ = xs.shape
    width = weight.shape[-1]
    state_len = width - 1
    _check_conv_state("causal_conv1d_update", conv_state, dim, state_len)
    if conv_state_indices is None:
        slots = torch.arange(batch, device=x.device)
    else:
        slots = conv_state_indices[:batch].long()
    valid = slots != pad_slot_id
    out = torch.zeros_like(xs)
    if bool(valid.any()):
        rows = valid.nonzero(as_tuple=True)[0]
        vslots = slots[rows]
        prev = conv_state[vslots].to(xs.dtype)
        window = torch.cat([prev, xs[rows]], dim=-1)  # [n, dim, width-1+T]
        n, _, total = window.shape
        y = _conv_window(window.reshape(n * dim, total), weight.repeat(n, 1),
                         None if bias is None else bias.repeat(n))
        y = _activate(y, activation).reshape(n, dim, -1)
        out[rows] = y.to(xs.dtype)
        conv_state[vslots] = window[:, :, -state_len:].to(conv_state.dtype)
    return out.squeeze(-1) if squeeze else out


# --------------------------------------------------------------------------- #
# Gating
# --------------------------------------------------------------------------- #
def _softplus(x: torch.Tensor, beta: float, threshold: float) -> torch.Tensor:
    bx = beta * x
    return torch.where(bx <= threshold, torch.log1p(torch.exp(bx)) / beta, x)


def gdn_decay(
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
) -> torch.Tensor:
    """Log-space decay ``g = -exp(A_log) * softplus(a + dt_bias)`` in fp32."""
    x = a.float() + dt_bias.float()
    return -torch.exp(A_log.float()) * _softplus(x, beta, threshold)


def fused_gdn_gating(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill gates ``(g, beta)`` as ``[1, T, HV]`` fp32 tensors.

    ``beta = sigmoid(b)`` is rounded through ``b``'s dtype first, as SGLang's
    kernel (and transformers' ``b.sigmoid()``) do.
    """
    g = gdn_decay(A_log, a, dt_bias, beta, threshold)
    beta_out = torch.sigmoid(b.float()).to(b.dtype).float()
    return g.unsqueeze(0), beta_out.unsqueeze(0)


# --------------------------------------------------------------------------- #
# Gated delta rule
# --------------------------------------------------------------------------- #
def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (FLA's definition)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _expand_heads(x: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """GQA: value head ``i`` reads key head ``i // (HV // H)``."""
    ratio = num_v_heads // x.shape[-2]
    return x if ratio == 1 else x.repeat_interleave(ratio, dim=-2)


def chunk_gated_delta_rule_single(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sequence, fp32, head-major: q,k ``[HV, T, K]``, v ``[HV, T, V]``,
    g,beta ``[HV, T]``, state ``[HV, K, V]`` (q already scaled, q/k normalised).

    Returns ``(o [HV, T, V], final_state [HV, K, V], h [N, HV, K, V])`` where
    ``h[n]`` is the state before chunk ``n`` (SGLang's prefix-cache checkpoints).
    """
    heads, length, _ = k.shape
    pad = (-length) % chunk_size
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    n = (length + pad) // chunk_size
    q, k, v = (t.reshape(heads, n, chunk_size, t.shape[-1]) for t in (q, k, v))
    g, beta = (t.reshape(heads, n, chunk_size) for t in (g, beta))

    gc = g.cumsum(dim=-1)  # log decay from the chunk start to each position
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    decay = (gc.unsqueeze(-1) - gc.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta.unsqueeze(-1)
    # UT transform: (I + strictly-lower(beta k k^T * decay)) u = beta v, likewise w.
    system = (k_beta @ k.transpose(-1, -2)) * decay
    u = torch.linalg.solve_triangular(system, v * beta.unsqueeze(-1), upper=False,
                                      unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * gc.exp().unsqueeze(-1),
                                      upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay
    q_decayed = q * gc.exp().unsqueeze(-1)
    last = gc[..., -1:]
    k_to_end = k * (last - gc).exp().unsqueeze(-1)
    chunk_decay = last.exp().unsqueeze(-1)  # [HV, N, 1, 1]

    out = torch.empty_like(u)
    h = torch.empty(n, *state.shape, dtype=state.dtype, device=state.device)
    for i in range(n):
        h[i] = state
        v_new = u[:, i] - w[:, i] @ state
        out[:, i] = q_decayed[:, i] @ state + attn[:, i] @ v_new
        state = state * chunk_decay[:, i] + k_to_end[:, i].transpose(-1, -2) @ v_new
    out = out.reshape(heads, n * chunk_size, -1)[:, :length]
    return out, state, h


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    initial_state_indices: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    head_first: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    inplace_update: bool = True,
    chunk_size: int = CHUNK_SIZE,
    **kwargs,
) -> tuple[torch.Tensor, None, torch.Tensor]:
    """Varlen chunked gated delta rule with SGLang's FLA calling convention.

    q,k ``[1, T, H, K]``; v ``[1, T, HV, V]``; g (log decay), beta ``[1, T, HV]``;
    ``initial_state`` is the SSM pool ``[slots, HV, V, K]`` read at
    ``initial_state_indices`` (a negative index means a zero state and no
    write-back) and, when ``inplace_update``, overwritten with the final states.
    Returns ``(o [1, T, HV, V] in q's dtype, None, h [1, sum(N_i), HV, V, K] fp32)``.
    """
    if head_first:
        raise ValueError("chunk_gated_delta_rule (torch CPU): head_first is not supported")
    if q.shape[0] != 1 and cu_seqlens is not None:
        raise ValueError("chunk_gated_delta_rule: batch must be 1 with cu_seqlens")
    batch, total, _, dk = k.shape
    num_v_heads, dv = v.shape[-2:]
    if cu_seqlens is None:
        bounds = [(b, 0, total) for b in range(batch)]
    else:
        starts = cu_seqlens.tolist()
        bounds = [(0, starts[i], starts[i + 1]) for i in range(len(starts) - 1)]
    scale = dk**-0.5 if scale is None else scale
    out = torch.zeros(batch, total, num_v_heads, dv, dtype=q.dtype, device=q.device)
    hs = []
    for seq, (b, begin, end) in enumerate(bounds):
        qs, ks = (_expand_heads(t[b, begin:end].float(), num_v_heads) for t in (q, k))
        if use_qk_l2norm_in_kernel:
            qs, ks = l2norm(qs), l2norm(ks)
        qs = qs * scale
        vs = v[b, begin:end].float()
        slot = -1
        if initial_state is not None:
            slot = seq if initial_state_indices is None else int(initial_state_indices[seq])
        if slot >= 0:
            state0 = initial_state[slot].float().transpose(-1, -2)
        else:
            state0 = torch.zeros(num_v_heads, dk, dv, dtype=torch.float32, device=q.device)
        o, final, h = chunk_gated_delta_rule_single(
            qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1),
            g[b, begin:end].float().transpose(0, 1), beta[b, begin:end].float().transpose(0, 1),
            state0, chunk_size,
        )
        out[b, begin:end] = o.transpose(0, 1).to(q.dtype)
        hs.append(h.transpose(-1, -2))
        if inplace_update and slot >= 0:
            initial_state[slot] = final.transpose(-1, -2).to(initial_state.dtype)
    h_all = torch.cat(hs, dim=0).unsqueeze(0) if hs else q.new_empty(
        1, 0, num_v_heads, dv, dk, dtype=torch.float32)
    return out, None, h_all


def recurrent_gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for a batch, fp32: q,k ``[B, HV, K]``, v ``[B, HV, V]``,
    g,beta ``[B, HV]``, state ``[B, HV, K, V]`` -> ``(o [B, HV, V], new state)``."""
    state = state * g.exp()[..., None, None]
    kv_mem = (state * k.unsqueeze(-1)).sum(dim=-2)
    delta = (v - kv_mem) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return (state * q.unsqueeze(-1)).sum(dim=-2), state


def fused_sigmoid_gating_delta_rule_update(
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float,
    softplus_threshold: float,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor,
    initial_state_indices: torch.Tensor,
    scale: Optional[float] = None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    is_kda: bool = False,
    disable_state_update: bool = False,
    **kwargs,
) -> torch.Tensor:
    """Recurrent (decode) gated delta rule with gating fused in, SGLang's convention.

    q,k ``[1, T, H, K]``, v ``[1, T, HV, V]``, a,b ``[T, HV]``; sequences given by
    ``cu_seqlens`` (one token each in decode). Reads/writes the pool
    ``[slots, HV, V, K]`` at ``initial_state_indices``; negative index = padding
    row (zero output, no write). Returns ``o [1, T, HV, V]`` in q's dtype.
    """
    if is_kda:
        raise NotImplementedError("fused_sigmoid_gating_delta_rule_update (torch CPU): KDA")
    if kwargs.get("intermediate_states_buffer") is not None or kwargs.get("cache_ring"):
        raise NotImplementedError(
            "fused_sigmoid_gating_delta_rule_update (torch CPU): speculative verify"
        )
    total = q.shape[1]
    num_v_heads, dv = v.shape[-2:]
    dk = q.shape[-1]
    scale = dk**-0.5 if scale is None else scale
    starts = cu_seqlens.tolist() if cu_seqlens is not None else list(range(total + 1))
    nseq = len(starts) - 1
    lengths = [starts[i + 1] - starts[i] for i in range(nseq)]
    slots = initial_state_indices[:nseq].long()
    valid = slots >= 0
    qs = _expand_heads(q[0].float(), num_v_heads)
    ks = _expand_heads(k[0].float(), num_v_heads)
    if use_qk_l2norm_in_kernel:
        qs, ks = l2norm(qs), l2norm(ks)
    qs = qs * scale
    vs = v[0].float()
    g = gdn_decay(A_log, a.reshape(total, num_v_heads), dt_bias,
                  softplus_beta, softplus_threshold)
    beta = torch.sigmoid(b.reshape(total, num_v_heads).float())
    out = torch.zeros(1, total, num_v_heads, dv, dtype=q.dtype, device=q.device)
    safe_slots = slots.clamp(min=0)
    state = initial_state_source[safe_slots].float().transpose(-1, -2)
    state = state * valid[:, None, None, None]
    steps = max(lengths) if lengths else 0
    start_t = torch.tensor(starts[:-1], dtype=torch.long, device=q.device)
    len_t = torch.tensor(lengths, dtype=torch.long, device=q.device)
    for t in range(steps):
        active = (len_t > t) & valid
        pos = (start_t + t).clamp(max=max(total - 1, 0))
        o, new_state = recurrent_gated_delta_step(
            qs[pos], ks[pos], vs[pos], g[pos], beta[pos], state
        )
        state = torch.where(active[:, None, None, None], new_state, state)
        rows = active.nonzero(as_tuple=True)[0]
        out[0, pos[rows]] = o[rows].to(q.dtype)
    if not disable_state_update and bool(valid.any()):
        rows = valid.nonzero(as_tuple=True)[0]
        initial_state_source[slots[rows]] = (
            state[rows].transpose(-1, -2).to(initial_state_source.dtype)
        )
    return out


# --------------------------------------------------------------------------- #
# Gated RMSNorm and output gate
# --------------------------------------------------------------------------- #
def gated_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    z: Optional[torch.Tensor],
    eps: float,
    activation: str = "swish",
    norm_before_gate: bool = True,
    group_size: Optional[int] = None,
) -> torch.Tensor:
    """FLA's ``RMSNorm(x, z)``: ``rmsnorm(x) * w * act(z)`` (or ``rmsnorm(x * act(z)) * w``
    when not ``norm_before_gate``), fp32 inside, one rounding to x's dtype."""
    if activation not in ("swish", "silu", "sigmoid"):
        raise ValueError(f"gated_rms_norm: unsupported activation {activation!r}")
    shape = x.shape
    xf = x.float().reshape(-1, shape[-1])
    gate = None
    if z is not None:
        zf = z.float().reshape(-1, shape[-1])
        gate = torch.sigmoid(zf) if activation == "sigmoid" else F.silu(zf)
        if not norm_before_gate:
            xf = xf * gate
    group = shape[-1] if group_size is None else group_size
    if shape[-1] % group:
        raise ValueError(f"gated_rms_norm: width {shape[-1]} not divisible by group {group}")
    xg = xf.reshape(xf.shape[0], -1, group)
    rstd = torch.rsqrt((xg * xg).mean(dim=-1, keepdim=True) + eps)
    y = (xg * rstd).reshape(xf.shape) * weight.float()
    if gate is not None and norm_before_gate:
        y = y * gate
    return y.to(x.dtype).reshape(shape)


def sigmoid_mul(
    attn_output: torch.Tensor, gate: torch.Tensor, inplace: bool = False, quant: bool = False
) -> torch.Tensor:
    """``attn_output * sigmoid(gate)`` (gate may be a ``[T, heads, dim]`` view)."""
    if quant:
        raise NotImplementedError("sigmoid_mul (torch CPU): fp8 quant epilogue")
    gate2d = gate.reshape(attn_output.shape)
    y = (attn_output.float() * torch.sigmoid(gate2d.float())).to(attn_output.dtype)
    if inplace:
        attn_output.copy_(y)
        return attn_output
    return y


# --------------------------------------------------------------------------- #
# Prefix-cache state tracking
# --------------------------------------------------------------------------- #
def track_mamba_states(
    conv_states: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    mamba_track_mask: torch.Tensor,
    mamba_track_indices: torch.Tensor,
    batch_size: int,
    check_freed_slots: bool = False,
    all_layers: bool = False,
) -> None:
    """Copy the conv/SSM state rows of tracked batch rows from their working slot
    ``cache_indices[i]`` to their checkpoint slot ``mamba_track_indices[i]``; with
    ``all_layers`` the pools are ``[layers, slots, ...]``."""
    if batch_size == 0:
        return
    mask = mamba_track_mask[:batch_size].bool()
    src = cache_indices[:batch_size].long()[mask]
    dst = mamba_track_indices[:batch_size].long()[mask]
    if check_freed_slots:
        keep = (src >= 0) & (dst >= 0)
        src, dst = src[keep], dst[keep]
    if src.numel() == 0:
        return
    for pool in (conv_states, ssm_states):
        if all_layers:
            pool[:, dst] = pool[:, src]
        else:
            pool[dst] = pool[src]
