"""SiLU-and-multiply, the gate of a SwiGLU MLP (Shazeer 2020): out = silu(x[:, :I]) * x[:, I:].

`silu_and_mul_quant_fp8` fuses the dynamic per-token FP8 quantization of the output (the input of
an FP8 down projection, models/quant/fp8.py): one program per row computes the row in column blocks
twice, first for its amax, then to scale and round it (the second pass reads the row's gate and up
again, mostly from L2), so the [T, I] output is written once in FP8 instead of written in the
activation dtype and read back by `per_token_quant_fp8` (which also makes two passes). Values are
rounded to the activation dtype before the amax, so q and scale are those of
`per_token_quant_fp8(silu_and_mul(x))` (the same fp32 arithmetic per value).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import FP8_DTYPE, FP8_MAX, check
from .pdl import gdc_enter, launch_options, use_pdl


@triton.jit
def _silu_and_mul_kernel(x, out, inter, stride_x, stride_o, BLOCK: tl.constexpr,
                         USE_PDL: tl.constexpr = False):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gdc_enter(USE_PDL)  # kernels/pdl.py
    # gate and up halves of this row, in fp32
    gate = tl.load(x + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x + row * stride_x + inter + offs, mask=mask, other=0.0).to(tl.float32)
    # silu(g) = g * sigmoid(g)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out + row * stride_o + offs, y.to(out.dtype.element_ty), mask=mask)


def _pick_config(inter: int) -> dict:
    """1024-wide column blocks (fewer for small rows), 4 warps."""
    return {"BLOCK": min(1024, triton.next_power_of_2(inter)), "num_warps": 4}


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2I] (gate then up, last dim contiguous) -> [T, I] in x's dtype, computed in fp32.

    Raises ValueError if x is not 2-D with an even, contiguous last dim.
    """
    check(x.dim() == 2 and x.shape[1] % 2 == 0, f"x must be [T, 2I], got {tuple(x.shape)}")
    check(x.stride(1) == 1, "x must have a contiguous last dim")
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_tokens, inter), dtype=x.dtype, device=x.device)
    if num_tokens == 0 or inter == 0:
        return out
    cfg = _pick_config(inter)
    grid = (num_tokens, triton.cdiv(inter, cfg["BLOCK"]))
    pdl = use_pdl(x)
    _silu_and_mul_kernel[grid](x, out, inter, x.stride(0), out.stride(0),
                               BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"], USE_PDL=pdl,
                               **launch_options(pdl))
    return out


_FP8_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def _silu_mul_block(x, row, stride_x, offs, INTER: tl.constexpr):
    """silu(gate) * up of one row's columns offs, rounded to x's dtype, as fp32."""
    mask = offs < INTER
    gate = tl.load(x + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x + row * stride_x + INTER + offs, mask=mask, other=0.0).to(tl.float32)
    return (gate / (1.0 + tl.exp(-gate)) * up).to(x.dtype.element_ty).to(tl.float32)


@triton.jit
def _silu_and_mul_quant_kernel(x, q, scale, stride_x, stride_q, INTER: tl.constexpr, BLOCK: tl.constexpr,
                               USE_PDL: tl.constexpr = False):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    gdc_enter(USE_PDL)  # kernels/pdl.py
    # pass 1: the row's largest magnitude
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for c0 in range(0, INTER, BLOCK):
        amax = tl.maximum(amax, tl.abs(_silu_mul_block(x, row, stride_x, c0 + offs, INTER)))
    a = tl.max(amax, 0)
    s = tl.where(a > 0.0, a / _FP8_MAX, 1.0)
    inv = 1.0 / s
    # pass 2: the same values again, scaled, saturated and rounded to nearest even
    for c0 in range(0, INTER, BLOCK):
        y = tl.clamp(_silu_mul_block(x, row, stride_x, c0 + offs, INTER) * inv, -_FP8_MAX, _FP8_MAX)
        tl.store(q + row * stride_q + c0 + offs, y.to(q.dtype.element_ty, fp_downcast_rounding="rtne"),
                 mask=(c0 + offs) < INTER)
    tl.store(scale + row, s)


# Row counts from which ops.silu_and_mul_fp8 takes the fused kernel on CUDA. H200, 2026-12-03
# (bench/lab/fp8_fused_quant.py, intermediate 18,944, us per call, fused / silu_and_mul then
# per_token_quant_fp8): 17 rows 7.85 / 5.35, 256 rows 14.12 / 13.48, 512 rows 31.39 / 23.50, 2,048
# rows 84.82 / 95.48, 8,192 rows 323.9 / 374.4: one program per row loops over the row serially,
# which only pays once there are enough rows to fill the GPU (1,024: between the measured counts).
QUANT_FUSED_MIN_ROWS = 1024


def _pick_quant_config(inter: int) -> dict:
    """Column blocks of up to 4,096 (8 warps from 2,048 up): the row in as few passes as fit."""
    block = min(4096, triton.next_power_of_2(inter))
    return {"BLOCK": block, "num_warps": 8 if block >= 2048 else 4}


def silu_and_mul_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [T, 2I] fp16/bf16/fp32 (gate then up, last dim contiguous) -> (q [T, I] float8_e4m3fn,
    scale [T, 1] float32) with q * scale ~= silu_and_mul(x), as
    `per_token_quant_fp8(silu_and_mul(x))` gives them (module docstring). Allocates its outputs (CUDA-graph
    safe). Raises ValueError if x is not 2-D with an even, contiguous last dim or of another dtype."""
    check(x.dim() == 2 and x.shape[1] % 2 == 0, f"x must be [T, 2I], got {tuple(x.shape)}")
    check(x.stride(1) == 1, "x must have a contiguous last dim")
    check(x.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {x.dtype}")
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    q = torch.empty((num_tokens, inter), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((num_tokens, 1), dtype=torch.float32, device=x.device)
    if num_tokens == 0 or inter == 0:
        return q, scale.fill_(1.0)
    cfg = _pick_quant_config(inter)
    pdl = use_pdl(x)
    _silu_and_mul_quant_kernel[(num_tokens,)](x, q, scale, x.stride(0), q.stride(0), INTER=inter,
                                              BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"], USE_PDL=pdl,
                                              **launch_options(pdl))
    return q, scale
