"""Dynamic per-token FP8 quantization of activations: x [M, K] -> (float8_e4m3fn [M, K], scale [M, 1]).

The FP8 linear (radixrt/models/quant/fp8.py) feeds `torch._scaled_mm` row-wise scaled FP8
activations: each row (token) gets scale = amax(|x_row|) / 448, the largest e4m3 value, so the row's
largest element maps to +-448 (dynamic per-token scaling, as in the FP8 formats paper, Micikevicius
et al. 2022, and vLLM's / SGLang's dynamic FP8 activations). One program per row makes two passes
over it, amax then scale-and-round (the second reads the row back from L1/L2): one launch instead of
the five of the torch form (abs, amax, divide, clamp, cast), which matters at decode sizes. A row of
zeros (e.g. CUDA-graph padding) gets scale 1.0, so nothing divides by zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import FP8_DTYPE, FP8_MAX, check, next_pow2

_FP8_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def _per_token_quant_kernel(x, q, scale, K, stride_x, stride_q, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    # pass 1: the row's largest magnitude
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        v = tl.load(x + row * stride_x + k0 + offs, mask=(k0 + offs) < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(v))
    a = tl.max(amax, 0)
    s = tl.where(a > 0.0, a / _FP8_MAX, 1.0)
    inv = 1.0 / s
    # pass 2: scale, saturate, round to nearest even
    for k0 in range(0, K, BLOCK_K):
        mask = (k0 + offs) < K
        v = tl.load(x + row * stride_x + k0 + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.clamp(v * inv, -_FP8_MAX, _FP8_MAX)
        tl.store(q + row * stride_q + k0 + offs, v.to(q.dtype.element_ty, fp_downcast_rounding="rtne"),
                 mask=mask)
    tl.store(scale + row, s)


def per_token_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (fp16/bf16/fp32, contiguous last dim) -> (q [M, K] float8_e4m3fn contiguous,
    scale [M, 1] float32 contiguous) with x ~= q * scale; scale = amax(|x_row|) / 448, 1.0 for a zero
    row. Allocates both outputs (sizes depend on shapes only: CUDA-graph safe); no host sync.
    Raises ValueError on a bad shape, dtype or stride."""
    check(x.dim() == 2, f"x must be [M, K], got {tuple(x.shape)}")
    check(x.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {x.dtype}")
    check(x.stride(-1) == 1, "x must have a contiguous last dim")
    m, k = x.shape
    q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m == 0 or k == 0:
        return q, scale.fill_(1.0)
    block_k = min(next_pow2(k), 4096)
    _per_token_quant_kernel[(m,)](x, q, scale, k, x.stride(0), q.stride(0), BLOCK_K=block_k,
                                  num_warps=8 if block_k >= 2048 else 4)
    return q, scale
