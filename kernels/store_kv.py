"""Write the new tokens' K and V into their KV-pool slots.

KV layout (one layer): `k_buffer`, `v_buffer` are `[num_slots, num_kv_heads, head_dim]`, slot =
page * page_size + offset (PagedAttention, Kwon et al. 2023). The scheduler picks the slots; this
kernel only scatters rows, so it is a pure copy bounded by memory bandwidth. An FP8 pool
(float8_e4m3fn, --kv-cache-dtype fp8_e4m3) stores K / k_scale and V / v_scale with one scale per
tensor and layer, saturated to +-448 (e4m3 has no infinity; an overflow would become NaN) and
rounded to nearest even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import FP8_DTYPE, FP8_MAX, check, next_pow2
from .pdl import gdc_enter, launch_options, use_pdl

_FP8_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def store_token(k_buf, v_buf, k_src, v_src, tok, out_cache_loc, num_kv_heads, k_inv_scale, v_inv_scale,
                stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h, stride_k_t, stride_k_h, stride_v_t,
                stride_v_h, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                QUANT: tl.constexpr):
    """Copy token `tok`'s K and V rows (all KV heads) into its pool slot, cast to the pool's dtype
    (an FP8 pool: scaled, saturated, rounded to nearest even). Shared by _store_kv_kernel and
    kernels/rotary.py's rope-and-store kernel."""
    offs_h = tl.arange(0, BLOCK_H)
    head = offs_h.to(tl.int64)  # int64: a head-major pool's head stride spans the whole buffer
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h < num_kv_heads)[:, None] & (offs_d < HEAD_DIM)[None, :]
    # slot of this token; int64 so that slot * stride cannot overflow on large pools
    slot = tl.load(out_cache_loc + tok).to(tl.int64)
    # copy all heads of this token's K and V rows, casting to the pool's dtype
    k = tl.load(k_src + tok * stride_k_t + offs_h[:, None] * stride_k_h + offs_d[None, :], mask=mask)
    v = tl.load(v_src + tok * stride_v_t + offs_h[:, None] * stride_v_h + offs_d[None, :], mask=mask)
    if QUANT:  # FP8 pool: scale, saturate, round to nearest even
        k = tl.clamp(k.to(tl.float32) * k_inv_scale, -_FP8_MAX, _FP8_MAX).to(k_buf.dtype.element_ty,
                                                                               fp_downcast_rounding="rtne")
        v = tl.clamp(v.to(tl.float32) * v_inv_scale, -_FP8_MAX, _FP8_MAX).to(v_buf.dtype.element_ty,
                                                                               fp_downcast_rounding="rtne")
    tl.store(k_buf + slot * stride_kb_s + head[:, None] * stride_kb_h + offs_d[None, :],
             k.to(k_buf.dtype.element_ty), mask=mask)
    tl.store(v_buf + slot * stride_vb_s + head[:, None] * stride_vb_h + offs_d[None, :],
             v.to(v_buf.dtype.element_ty), mask=mask)


# out_cache_loc is a slice of one uploaded buffer whose alignment varies with the batch size
# (worker/device_batch.py); one element is loaded per program, so no variant per alignment
@triton.jit(do_not_specialize_on_alignment=["out_cache_loc"])
def _store_kv_kernel(
    k_buf, v_buf, k_src, v_src, out_cache_loc, num_kv_heads, k_inv_scale, v_inv_scale,
    stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    tok = tl.program_id(0).to(tl.int64)
    gdc_enter(USE_PDL)  # kernels/pdl.py
    store_token(k_buf, v_buf, k_src, v_src, tok, out_cache_loc, num_kv_heads, k_inv_scale, v_inv_scale,
                stride_kb_s, stride_kb_h, stride_vb_s, stride_vb_h, stride_k_t, stride_k_h, stride_v_t,
                stride_v_h, HEAD_DIM, BLOCK_H, BLOCK_D, QUANT)


def _pick_config(num_kv_heads: int, head_dim: int) -> dict:
    """One program copies one token (all KV heads) of K and of V."""
    block_h, block_d = next_pow2(num_kv_heads), next_pow2(head_dim)
    return {"BLOCK_H": block_h, "BLOCK_D": block_d, "num_warps": 4 if block_h * block_d >= 1024 else 1}


def check_store_args(k_buffer: torch.Tensor, v_buffer: torch.Tensor, out_cache_loc: torch.Tensor,
                     k: torch.Tensor, v: torch.Tensor, k_scale: float, v_scale: float) -> bool:
    """store_kv's argument checks (raises ValueError); returns whether the pool is FP8."""
    check(k_buffer.dim() == 3 and v_buffer.shape == k_buffer.shape, "k_buffer/v_buffer must be [S, Hkv, D]")
    num_tokens, num_kv_heads, head_dim = k.shape
    check(k.shape == v.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    check(tuple(k_buffer.shape[1:]) == (num_kv_heads, head_dim),
          f"k is {tuple(k.shape)} but the pool rows are {tuple(k_buffer.shape[1:])}")
    check(out_cache_loc.shape == (num_tokens,), f"out_cache_loc must be [{num_tokens}]")
    check(out_cache_loc.dtype in (torch.int64, torch.int32), "out_cache_loc must be int64 or int32")
    check(out_cache_loc.device == k_buffer.device, "out_cache_loc is not on the pool's device")
    for name, t in (("k_buffer", k_buffer), ("v_buffer", v_buffer), ("k", k), ("v", v)):
        check(t.stride(-1) == 1, f"{name} must have a contiguous last dim")
        check(t.device == k_buffer.device, f"{name} is on {t.device}, the pool on {k_buffer.device}")
    quant = k_buffer.dtype == FP8_DTYPE
    check(not quant or (k_scale > 0 and v_scale > 0), f"bad FP8 KV scales {k_scale}, {v_scale}")
    return quant


def store_kv(k_buffer: torch.Tensor, v_buffer: torch.Tensor, out_cache_loc: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Scatter new K/V rows into the pool, in place: `k_buffer[out_cache_loc[t]] = k[t]`.

    k_buffer, v_buffer : [S, Hkv, D]  pool of one layer (any float dtype; the last dim contiguous)
    out_cache_loc      : [T] int64 (int32 accepted)  slot of each new token; slots must be distinct
                         except for padding tokens that all go to the sink page 0
    k, v               : [T, Hkv, D]  may be strided views (e.g. slices of a fused QKV output)
                         with a contiguous last dim; cast to the pool dtype on store.
    k_scale, v_scale   : host floats > 0, the layer's scales of an FP8 (float8_e4m3fn) pool, which
                         stores clamp(k / k_scale, +-448); ignored for other pools
    Raises ValueError on shape, device or stride mismatches. No host synchronisation.
    """
    quant = check_store_args(k_buffer, v_buffer, out_cache_loc, k, v, k_scale, v_scale)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    cfg, pdl = _pick_config(num_kv_heads, head_dim), use_pdl(k_buffer)
    _store_kv_kernel[(num_tokens,)](
        k_buffer, v_buffer, k, v, out_cache_loc, num_kv_heads,
        1.0 / float(k_scale) if quant else 1.0, 1.0 / float(v_scale) if quant else 1.0,
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        HEAD_DIM=head_dim, BLOCK_H=cfg["BLOCK_H"], BLOCK_D=cfg["BLOCK_D"], QUANT=quant,
        num_warps=cfg["num_warps"], USE_PDL=pdl, **launch_options(pdl),
    )
