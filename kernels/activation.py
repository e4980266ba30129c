"""SiLU-and-multiply, the gate of a SwiGLU MLP (Shazeer 2020): out = silu(x[:, :I]) * x[:, I:]."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import check
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
