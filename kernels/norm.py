"""RMSNorm (Zhang & Sennrich 2019) with the residual add of a pre-norm block fused in.

    residual' = x + residual          (rounded to the activation dtype, as an unfused model does)
    out       = residual' / sqrt(mean(residual'^2) + eps) * weight      (statistics in fp32)

One program per row; the whole row fits in one block (hidden sizes up to 64K).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import check, next_pow2
from .pdl import gdc_enter, launch_options, use_pdl


@triton.jit
def _rms_norm_kernel(
    x, residual, weight, out, new_residual, eps,
    stride_x, stride_r, stride_o, stride_nr,
    N: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    w = tl.load(weight + offs, mask=mask, other=0.0).to(tl.float32)  # a parameter: before the wait
    gdc_enter(USE_PDL)  # kernels/pdl.py
    h = tl.load(x + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # fused residual add, rounded to the activation dtype and written back for the next block
        r = tl.load(residual + row * stride_r + offs, mask=mask, other=0.0)
        h = (h.to(tl.float32) + r.to(tl.float32)).to(x.dtype.element_ty)
        tl.store(new_residual + row * stride_nr + offs, h, mask=mask)
    # mean of squares in fp32, then scale by the weight
    hf = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, 0) / N + eps)
    tl.store(out + row * stride_o + offs, (hf * rstd * w).to(out.dtype.element_ty), mask=mask)


def _pick_config(hidden: int) -> dict:
    """One block per row; more warps for wide rows."""
    block = next_pow2(hidden)
    return {"BLOCK": block, "num_warps": min(16, max(1, block // 512))}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim with an optional fused residual add.

    x        : [..., H] fp16/bf16/fp32 (last dim contiguous; leading dims are flattened)
    weight   : [H]
    residual : optional [..., H] same shape and dtype as x
    Returns (out, new_residual) shaped like x: with a residual (both fresh tensors),
    new_residual = x + residual and out = rms_norm(new_residual) * weight; without one,
    new_residual is x itself and out = rms_norm(x) * weight. Raises ValueError on mismatches.
    """
    hidden = x.shape[-1]
    check(weight.shape == (hidden,), f"weight must be [{hidden}], got {tuple(weight.shape)}")
    check(weight.device == x.device, "weight and x are on different devices")
    check(hidden <= 65536, f"hidden size {hidden} is too large for one block")
    x2 = x.reshape(-1, hidden)
    check(x2.stride(-1) == 1, "x must have a contiguous last dim")
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if residual is not None:
        check(residual.shape == x.shape and residual.dtype == x.dtype and residual.device == x.device,
              "residual must match x in shape, dtype and device")
        r2 = residual.reshape(-1, hidden)
        check(r2.stride(-1) == 1, "residual must have a contiguous last dim")
        new_r2 = torch.empty_like(out)
    else:
        r2, new_r2 = x2, out  # unused by the kernel when HAS_RESIDUAL is False
    num_rows = x2.shape[0]
    if num_rows > 0:
        cfg, pdl = _pick_config(hidden), use_pdl(x)
        _rms_norm_kernel[(num_rows,)](
            x2, r2, weight, out, new_r2, float(eps),
            x2.stride(0), r2.stride(0), out.stride(0), new_r2.stride(0),
            N=hidden, BLOCK=cfg["BLOCK"], HAS_RESIDUAL=residual is not None, num_warps=cfg["num_warps"],
            USE_PDL=pdl, **launch_options(pdl),
        )
    if residual is None:
        return out.view(x.shape), x
    return out.view(x.shape), new_r2.view(x.shape)
