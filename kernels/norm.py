"""RMSNorm (Zhang & Sennrich 2019) with the residual add of a pre-norm block fused in.

    residual' = x + residual          (rounded to the activation dtype, as an unfused model does)
    out       = residual' / sqrt(mean(residual'^2) + eps) * weight      (statistics in fp32)

One program per row; the whole row fits in one block (hidden sizes up to 64K).

`rms_norm_quant_fp8` is the same kernel with the dynamic per-token FP8 quantization of its output
fused in (the input of an FP8 linear, models/quant/fp8.py): out is rounded to the activation dtype
as above, then scale = amax(|out_row|) / 448 (1.0 for a zero row) and q = rtne(clamp(out * (1 /
scale), +-448)), what `per_token_quant_fp8(rms_norm(...)[0])` gives (up to the order in which the
compiled kernel sums a row's squares: a scale's last bits, an FP8 value's last step, in a few rows),
without writing `out` or reading it back (vLLM and SGLang fuse the same pair; their kernels were not
read)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import FP8_DTYPE, FP8_MAX, check, next_pow2
from .pdl import gdc_enter, launch_options, use_pdl

_FP8_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def _rms_norm_kernel(
    x, residual, weight, out, new_residual, eps,
    stride_x, stride_r, stride_o, stride_nr, scale,
    N: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, USE_PDL: tl.constexpr = False,
    QUANT: tl.constexpr = False,
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
    y = (hf * rstd * w).to(x.dtype.element_ty)
    if QUANT:
        # out is FP8 [M, N]: the rounded row scaled by its own amax, as kernels/fp8_quant.py does
        yf = y.to(tl.float32)
        a = tl.max(tl.abs(yf), 0)
        s = tl.where(a > 0.0, a / _FP8_MAX, 1.0)
        yq = tl.clamp(yf * (1.0 / s), -_FP8_MAX, _FP8_MAX)
        tl.store(out + row * stride_o + offs, yq.to(out.dtype.element_ty, fp_downcast_rounding="rtne"),
                 mask=mask)
        tl.store(scale + row, s)
    else:
        tl.store(out + row * stride_o + offs, y.to(out.dtype.element_ty), mask=mask)


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
    out, _, new_residual = _launch(x, weight, eps, residual, quant=False)
    return out, new_residual


def rms_norm_quant_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float,
                       residual: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`rms_norm` whose output is quantized per token to FP8 in the same kernel (module docstring).

    x [M, H] fp16/bf16/fp32, weight [H], residual optional [M, H] like x. Returns (q [M, H]
    float8_e4m3fn, scale [M, 1] float32, new_residual [M, H] in x's dtype) with q * scale ~=
    rms_norm(x, weight, eps, residual)[0]; `per_token_quant_fp8` of that output up to the fp32
    summation order of the row's squares (module docstring).
    Allocates its outputs (CUDA-graph safe). Raises ValueError on a bad shape, dtype or stride."""
    check(x.dim() == 2, f"x must be [M, H], got {tuple(x.shape)}")
    check(x.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {x.dtype}")
    return _launch(x, weight, eps, residual, quant=True)


def _launch(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
            quant: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(out, scale or None, new_residual) of one _rms_norm_kernel launch (checks as rms_norm)."""
    hidden = x.shape[-1]
    check(weight.shape == (hidden,), f"weight must be [{hidden}], got {tuple(weight.shape)}")
    check(weight.device == x.device, "weight and x are on different devices")
    check(hidden <= 65536, f"hidden size {hidden} is too large for one block")
    x2 = x.reshape(-1, hidden)
    check(x2.stride(-1) == 1, "x must have a contiguous last dim")
    out = torch.empty(x2.shape, dtype=FP8_DTYPE if quant else x.dtype, device=x.device)
    scale = torch.empty((x2.shape[0], 1), dtype=torch.float32, device=x.device) if quant else None
    if residual is not None:
        check(residual.shape == x.shape and residual.dtype == x.dtype and residual.device == x.device,
              "residual must match x in shape, dtype and device")
        r2 = residual.reshape(-1, hidden)
        check(r2.stride(-1) == 1, "residual must have a contiguous last dim")
        new_r2 = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    else:
        r2, new_r2 = x2, x2  # unused by the kernel when HAS_RESIDUAL is False
    num_rows = x2.shape[0]
    if num_rows > 0:
        cfg, pdl = _pick_config(hidden), use_pdl(x)
        _rms_norm_kernel[(num_rows,)](
            x2, r2, weight, out, new_r2, float(eps),
            x2.stride(0), r2.stride(0), out.stride(0), new_r2.stride(0), out if scale is None else scale,
            N=hidden, BLOCK=cfg["BLOCK"], HAS_RESIDUAL=residual is not None, num_warps=cfg["num_warps"],
            USE_PDL=pdl, QUANT=quant, **launch_options(pdl),
        )
    if quant:
        return out, scale, (x if residual is None else new_r2)
    if residual is None:
        return out.view(x.shape), None, x
    return out.view(x.shape), None, new_r2.view(x.shape)
