"""RMSNorm and SiLU-and-mul with the per-token FP8 quantization fused in (kernels/norm.py,
kernels/activation.py) against the unfused pair: the kernel's output quantized by the reference
quantizer.

On a GPU the FP8 bytes and scales must match `per_token_quant_fp8` of the unfused kernel's output
(also at Qwen2.5-7B's widths, and replayed from a CUDA graph: tests/kernels/test_fp8_gpu.py) up to
what the compiled kernels' own fp32 summation order allows: the fused RMSNorm may sum a row's
squares in another order than the plain one (H200, 2026-12-03: exact equality failed at 33 x 1,024
fp32 and 8,192 x 3,584 bf16; the order is the likely cause, not proven), so
a scale may differ in its last bits and an FP8 value by one step (`assert_quant_matches`). On the
CPU the kernels run in the Triton interpreter, whose float -> e4m3 conversion rounds half up and
drops the carry into the exponent (triton/runtime/interpreter.py `_convert_float`: 124.6 becomes 64,
not 128; values below the smallest normal become 0), so there the reference's scaled fp32 values
are rounded by that same function: the test then checks everything the kernel computes (amax,
scale, scaled values, layout, residual) and leaves the rounding itself, subnormals included, to the
GPU run."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import (
    per_token_quant_fp8,
    rms_norm,
    rms_norm_quant_fp8,
    silu_and_mul,
    silu_and_mul_quant_fp8,
)
from radixrt.models.quant.fp8 import FP8_DTYPE, FP8_MAX

from .conftest import DEVICE


def _randn(*shape, dtype, seed, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE, dtype)


def _reference_quant(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 bytes as uint8, scale [M, 1]) of y [M, K] as kernels/fp8_quant.py defines them, rounded
    as the device running the kernels rounds (module docstring)."""
    if DEVICE.type == "cuda":  # the unfused quantizer (its divisions round as the fused kernels' do)
        q, scale = per_token_quant_fp8(y)
        return q.view(torch.uint8), scale
    yf = y.float()
    amax = yf.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    v = (yf * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX)
    import numpy as np
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime.interpreter import _convert_float

    q = _convert_float(v.cpu().numpy().astype(np.float32), tl.float32, tl.float8e4nv, ir.ROUNDING_MODE.RTNE)
    return torch.from_numpy(np.asarray(q).view(np.uint8).reshape(v.shape)).to(DEVICE), scale


def assert_quant_matches(q: torch.Tensor, scale: torch.Tensor, want_q: torch.Tensor,
                         want_scale: torch.Tensor) -> None:
    """q (float8_e4m3fn) and scale against the reference bytes / scales: equal on the CPU; on a GPU
    scales within a relative 5e-7 (a few fp32 ulp), at most 0.1% of the values different, each by at
    most one e4m3 step."""
    if DEVICE.type != "cuda":
        assert torch.equal(scale, want_scale)
        assert torch.equal(q.view(torch.uint8), want_q)
        return
    torch.testing.assert_close(scale, want_scale, rtol=5e-7, atol=0)
    got, ref = q.float(), want_q.view(FP8_DTYPE).float()  # in the scaled domain, [-448, 448]
    differ = got != ref
    assert differ.float().mean() <= 1e-3
    # one e4m3 step at ref: 2^(exponent - 3) in the normal range (>= 2^-6), 2^-9 below it
    step = torch.exp2(torch.floor(torch.log2(ref.abs().clamp(min=2.0 ** -6))) - 3)
    assert ((got - ref).abs() <= step)[differ].all()


DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, hidden, with_residual", [(5, 64, False), (7, 200, True), (33, 1024, True)])
def test_rms_norm_quant_matches_norm_then_quant(dtype, rows, hidden, with_residual) -> None:
    x = _randn(rows, hidden, dtype=dtype, seed=1, scale=3.0)
    x[3] = 0.0  # a zero row (CUDA-graph padding): scale 1, zero bytes
    w = _randn(hidden, dtype=dtype, seed=2)
    res = _randn(rows, hidden, dtype=dtype, seed=3) if with_residual else None
    if res is not None:
        res[3] = 0.0
    out, new_res = rms_norm(x, w, 1e-6, res)
    q, scale, new_res2 = rms_norm_quant_fp8(x, w, 1e-6, res)
    want_q, want_scale = _reference_quant(out)
    assert q.dtype == FP8_DTYPE and q.shape == (rows, hidden) and scale.shape == (rows, 1)
    assert_quant_matches(q, scale, want_q, want_scale)
    assert torch.equal(new_res2, new_res)
    assert scale[3, 0] == 1.0 and not q[3].float().any()  # +-0
    assert (scale[torch.arange(rows) != 3] != 1.0).all()  # the other rows hold data


@pytest.mark.parametrize("form", ["one_pass", "two_pass"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, inter", [(2, 96), (5, 3000), (3, 5000)])  # one block; 1 and 2 blocks + tail
def test_silu_and_mul_quant_matches_silu_then_quant(dtype, rows, inter, form) -> None:
    x = _randn(rows, 2 * inter, dtype=dtype, seed=4, scale=2.0)
    x[rows // 2] = 0.0  # a zero row; the others hold data
    y = silu_and_mul(x)
    q, scale = silu_and_mul_quant_fp8(x, form=form)
    want_q, want_scale = _reference_quant(y)
    assert q.dtype == FP8_DTYPE and q.shape == (rows, inter) and scale.shape == (rows, 1)
    assert_quant_matches(q, scale, want_q, want_scale)
    assert scale[rows // 2, 0] == 1.0 and (scale[torch.arange(rows) != rows // 2] != 1.0).all()


@pytest.mark.parametrize("nchunk", [3, 4, 5, 6])
def test_silu_and_mul_quant_one_pass_every_block_counts(nchunk) -> None:
    """The one-pass form at 3-6 blocks of 4,096 (the last one partial; Qwen2.5-7B's 18,944 is 5):
    row r's largest value sits in block r, so a block left out of the amax or of the stores changes
    that row's scale or values. Both forms give the reference's FP8 values and scales."""
    inter = (nchunk - 1) * 4096 + 1000
    x = _randn(nchunk, 2 * inter, dtype=torch.float32, seed=5)
    for r in range(nchunk):  # a large gate and up in column 100 of block r (the last block's is partial)
        col = r * 4096 + 100
        x[r, col], x[r, inter + col] = 8.0, 8.0 if r % 2 else -8.0
    want_q, want_scale = _reference_quant(silu_and_mul(x))
    for form in ("one_pass", "two_pass"):
        q, scale = silu_and_mul_quant_fp8(x, form=form)
        assert_quant_matches(q, scale, want_q, want_scale)
    # and each row's scale is the one its planted block gives (not a smaller one from other blocks)
    planted = torch.stack([silu_and_mul(x)[r, r * 4096 + 100].abs() for r in range(nchunk)])
    assert torch.allclose(want_scale[:, 0], planted / 448.0)


def test_silu_and_mul_quant_form_rule() -> None:
    """"auto" runs the one-pass form up to 6 blocks of 4,096 (16 warps from 8,192 columns) and the
    two passes beyond, where the fused kernel is taken only from 1,024 rows; a one-pass call on a
    wider row, or with num_warps <= 0, raises (also for an empty batch)."""
    from radixrt.kernels.activation import _pick_quant_config, quant_fused_min_rows

    assert _pick_quant_config(18944) == {"BLOCK": 4096, "NCHUNK": 5, "num_warps": 16}
    assert _pick_quant_config(6 * 4096)["NCHUNK"] == 6
    assert _pick_quant_config(6 * 4096 + 1)["NCHUNK"] == 0  # two passes
    assert _pick_quant_config(96) == {"BLOCK": 128, "NCHUNK": 1, "num_warps": 4}
    assert quant_fused_min_rows(18944) == 17 and quant_fused_min_rows(28672) == 1024
    wide = _randn(2, 2 * (7 * 4096), dtype=torch.float32, seed=6)
    q, scale = silu_and_mul_quant_fp8(wide)  # "auto" takes the two passes here
    assert_quant_matches(q, scale, *_reference_quant(silu_and_mul(wide)))
    with pytest.raises(ValueError, match="at most 6 blocks"):
        silu_and_mul_quant_fp8(wide, form="one_pass")
    with pytest.raises(ValueError, match="at most 6 blocks"):
        silu_and_mul_quant_fp8(wide[:0], form="one_pass")
    with pytest.raises(ValueError, match="num_warps"):
        silu_and_mul_quant_fp8(wide, num_warps=0)
    with pytest.raises(ValueError, match="form"):
        silu_and_mul_quant_fp8(wide, form="fused")


def test_fused_quant_shapes_and_errors() -> None:
    q, scale = silu_and_mul_quant_fp8(torch.empty(0, 64, device=DEVICE))
    assert q.shape == (0, 32) and scale.shape == (0, 1)
    with pytest.raises(ValueError, match="2I"):
        silu_and_mul_quant_fp8(torch.empty(3, 63, device=DEVICE))
    with pytest.raises(ValueError, match="dtype"):
        silu_and_mul_quant_fp8(torch.empty(3, 64, device=DEVICE, dtype=torch.float64))
    with pytest.raises(ValueError, match="dtype"):
        rms_norm_quant_fp8(torch.ones(2, 64, device=DEVICE, dtype=torch.float64),
                           torch.ones(64, device=DEVICE, dtype=torch.float64), 1e-6)
    with pytest.raises(ValueError, match=r"\[M, H\]"):
        rms_norm_quant_fp8(torch.empty(2, 3, 64, device=DEVICE), torch.ones(64, device=DEVICE), 1e-6)
