"""Rotary position embedding (RoFormer, Su et al. 2021), NeoX "rotate-half" layout, in place.

For each head vector x and position p, with x1 = x[:R/2], x2 = x[R/2:R] (R = rotary dim <= D):
    x1' = x1 * cos(p * f) - x2 * sin(p * f)
    x2' = x2 * cos(p * f) + x1 * sin(p * f)
Dims past R are left as they are. The cos/sin table is built once per model by `build_rope_cache`,
including the Llama-3 frequency rescaling for long contexts.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._checks import check, next_pow2
from .pdl import gdc_enter, launch_options, use_pdl
from .store_kv import check_store_args, store_token


@triton.jit
def _rope_heads(x, stride_t, stride_h, tok, cos, sin, num_heads,
                HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Rotate all heads of one token of q or k in place (cos, sin: [BLOCK_HALF] fp32)."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_r = tl.arange(0, BLOCK_HALF)
    mask = (offs_h < num_heads)[:, None] & (offs_r < HALF)[None, :]
    p1 = x + tok * stride_t + offs_h[:, None] * stride_h + offs_r[None, :]
    p2 = p1 + HALF
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    tl.store(p1, (x1 * cos[None, :] - x2 * sin[None, :]).to(x.dtype.element_ty), mask=mask)
    tl.store(p2, (x2 * cos[None, :] + x1 * sin[None, :]).to(x.dtype.element_ty), mask=mask)


@triton.jit
def _rope_token(q, k, positions, cos_sin, tok, num_q_heads, num_kv_heads, stride_q_t, stride_q_h, stride_k_t,
                stride_k_h, stride_cs, HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr,
                BLOCK_HALF: tl.constexpr):
    """Rotate token `tok`'s query heads, then its key heads, in place."""
    # this token's cos/sin row: cache[pos, :HALF] = cos, cache[pos, HALF:2*HALF] = sin
    pos = tl.load(positions + tok).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_sin + pos * stride_cs + offs_r, mask=offs_r < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin + pos * stride_cs + HALF + offs_r, mask=offs_r < HALF, other=0.0).to(tl.float32)
    _rope_heads(q, stride_q_t, stride_q_h, tok, cos, sin, num_q_heads, HALF, BLOCK_HQ, BLOCK_HALF)
    _rope_heads(k, stride_k_t, stride_k_h, tok, cos, sin, num_kv_heads, HALF, BLOCK_HKV, BLOCK_HALF)


# The worker passes positions and out_cache_loc as slices of one uploaded buffer
# (worker/device_batch.py), 16-byte aligned or not by batch size: specialising on that alignment
# would compile a second variant at the first pass of the other kind. Each program loads one
# element of each, so the alignment buys nothing.
@triton.jit(do_not_specialize_on_alignment=["positions"])
def _rope_kernel(
    q, k, positions, cos_sin, num_q_heads, num_kv_heads,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_cs,
    HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_HALF: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    tok = tl.program_id(0).to(tl.int64)
    gdc_enter(USE_PDL)  # kernels/pdl.py: positions may come from an earlier kernel
    _rope_token(q, k, positions, cos_sin, tok, num_q_heads, num_kv_heads, stride_q_t, stride_q_h, stride_k_t,
                stride_k_h, stride_cs, HALF, BLOCK_HQ, BLOCK_HKV, BLOCK_HALF)


@triton.jit(do_not_specialize_on_alignment=["positions", "out_cache_loc"])
def _rope_store_kernel(
    q, k, v, positions, cos_sin, num_q_heads, num_kv_heads,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_cs,
    k_buf, v_buf, out_cache_loc, k_inv_scale, v_inv_scale, stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
    HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    tok = tl.program_id(0).to(tl.int64)
    gdc_enter(USE_PDL)
    _rope_token(q, k, positions, cos_sin, tok, num_q_heads, num_kv_heads, stride_q_t, stride_q_h, stride_k_t,
                stride_k_h, stride_cs, HALF, BLOCK_HQ, BLOCK_HKV, BLOCK_HALF)
    # the rotated k rows that other threads of this program wrote, before they are read back whole
    # (bar.sync orders the CTA's global memory accesses)
    tl.debug_barrier()
    store_token(k_buf, v_buf, k, v, tok, out_cache_loc, num_kv_heads, k_inv_scale, v_inv_scale,
                stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h, stride_k_t, stride_k_h, stride_v_t,
                stride_v_h, HEAD_DIM, BLOCK_HKV, BLOCK_D, QUANT)


def _check_rotary_args(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                       cos_sin_cache: torch.Tensor) -> None:
    """apply_rotary's argument checks (raises ValueError)."""
    check(q.dim() == 3 and k.dim() == 3 and q.shape[0] == k.shape[0] and q.shape[2] == k.shape[2],
          "q must be [T, Hq, D] and k [T, Hkv, D]")
    num_tokens, _, head_dim = q.shape
    check(cos_sin_cache.dim() == 2, "cos_sin_cache must be [max_position, rotary_dim]")
    rotary_dim = cos_sin_cache.shape[1]
    check(rotary_dim % 2 == 0 and rotary_dim <= head_dim,
          f"rotary dim {rotary_dim} must be even and <= {head_dim}")
    check(positions.shape == (num_tokens,) and positions.dtype in (torch.int64, torch.int32),
          f"positions must be [{num_tokens}] int64/int32")
    check(q.dtype == k.dtype, "q and k dtypes differ")
    check(q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1,
          "q, k and cos_sin_cache need a contiguous last dim")
    for t in (k, positions, cos_sin_cache):
        check(t.device == q.device, f"all tensors must be on {q.device}")


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                 cos_sin_cache: torch.Tensor) -> None:
    """Apply NeoX-style RoPE to q and k in place.

    q         : [T, Hq, D]   fp16/bf16/fp32, may be a strided view (e.g. of a fused QKV output)
    k         : [T, Hkv, D]  same dtype as q; both need a contiguous last dim
    positions : [T] int64 (int32 accepted) token positions, each < cos_sin_cache.shape[0]
    cos_sin_cache : [max_position, R] fp32, cos in [:, :R/2] and sin in [:, R/2:], R even, R <= D
    Raises ValueError on bad shapes. Positions are not range-checked on the device.
    """
    _check_rotary_args(q, k, positions, cos_sin_cache)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    rotary_dim = cos_sin_cache.shape[1]
    if num_tokens == 0:
        return
    half = rotary_dim // 2
    block_hq, block_hkv, block_half = next_pow2(num_q_heads), next_pow2(num_kv_heads), next_pow2(half)
    pdl = use_pdl(q)
    _rope_kernel[(num_tokens,)](
        q, k, positions, cos_sin_cache, num_q_heads, num_kv_heads,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        HALF=half, BLOCK_HQ=block_hq, BLOCK_HKV=block_hkv, BLOCK_HALF=block_half,
        num_warps=4 if block_hq * block_half >= 1024 else 1, USE_PDL=pdl, **launch_options(pdl),
    )


def rope_store_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                  cos_sin_cache: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                  out_cache_loc: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """`apply_rotary(q, k, positions, cos_sin_cache)` then `store_kv(k_buffer, v_buffer,
    out_cache_loc, k, v, k_scale, v_scale)` in one launch: each program rotates its token's q and k
    heads in place and writes the rotated k and v rows into the token's pool slot (an FP8 pool's
    rows scaled, saturated and rounded as store_kv does). The same values as the two calls; one
    launch and one pass over the token instead of two (the decode step's rotary and K/V store
    kernels, 28 each per step of a 28-layer model). Arguments and errors as the two functions'."""
    _check_rotary_args(q, k, positions, cos_sin_cache)
    quant = check_store_args(k_buffer, v_buffer, out_cache_loc, k, v, k_scale, v_scale)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if num_tokens == 0:
        return
    half = cos_sin_cache.shape[1] // 2
    block_hq, block_hkv = next_pow2(num_q_heads), next_pow2(num_kv_heads)
    block_half, block_d = next_pow2(half), next_pow2(head_dim)
    pdl = use_pdl(q)
    _rope_store_kernel[(num_tokens,)](
        q, k, v, positions, cos_sin_cache, num_q_heads, num_kv_heads,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos_sin_cache.stride(0),
        k_buffer, v_buffer, out_cache_loc, 1.0 / float(k_scale) if quant else 1.0,
        1.0 / float(v_scale) if quant else 1.0, k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0),
        v_buffer.stride(1),
        HALF=half, BLOCK_HQ=block_hq, BLOCK_HKV=block_hkv, BLOCK_HALF=block_half, HEAD_DIM=head_dim,
        BLOCK_D=block_d, QUANT=quant, num_warps=4 if block_hq * block_half >= 1024 else 1, USE_PDL=pdl,
        **launch_options(pdl),
    )


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama-3 frequency rescaling (Meta, Llama 3.1 release): keep high frequencies, divide low ones
    by `factor`, and interpolate smoothly in wavelength between the two bands."""
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    old_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_len / low_freq_factor
    high_freq_wavelen = old_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, scaled)


def build_rope_cache(rotary_dim: int, max_position: int, base: float,
                     rope_scaling: dict | None = None,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """cos/sin table for `apply_rotary`: [max_position, rotary_dim] fp32 (cos first half, sin second).

    inv_freq[i] = base ** (-2i / rotary_dim). rope_scaling (a model config's dict) may be None,
    {"rope_type": "default"}, {"rope_type": "linear", "factor"} (positions divided by factor) or
    {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"} (the older key "type" is accepted for "rope_type").
    Raises ValueError for other scaling types.
    """
    check(rotary_dim % 2 == 0 and rotary_dim > 0, f"rotary_dim must be even, got {rotary_dim}")
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    kind = "default"
    if rope_scaling:
        kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, rope_scaling)
    elif kind == "linear":
        inv_freq = inv_freq / float(rope_scaling["factor"])
    elif kind != "default":
        raise ValueError(f"unsupported rope scaling type {kind!r}")
    t = torch.arange(max_position, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)  # [max_position, R/2]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device)
