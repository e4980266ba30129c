"""The cvt-free FP8 GEMV of bench/lab/fp8_int.py (issue 19, not yet measured on a GPU): e4m3 bytes turned
into float32 bits with integer ops (value x 2^-120), x (bf16) scaled by 2^48, the scale by 2^72.

CPU through the Triton interpreter: the kernel only moves bf16 and e4m3 bits and computes in fp32, so
the interpreter's bf16 arithmetic is never used. Outputs are checked in fp32 against a float64
reference on the same bytes, including every non-NaN e4m3 value (subnormals, +-0, +-448)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from .conftest import DEVICE

_SPEC = importlib.util.spec_from_file_location(
    "fp8_int_lab", Path(__file__).resolve().parents[2] / "bench" / "lab" / "fp8_int.py")
fp8_int = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fp8_int)

FP8 = torch.float8_e4m3fn


def _all_e4m3_bytes() -> torch.Tensor:
    b = torch.arange(256, dtype=torch.int32)
    return b[(b & 0x7F) != 0x7F].to(torch.uint8)  # 254 values: NaNs (0x7F, 0xFF) left out


def _run(x, w8, scale, bias=None, block_n=8, block_k4=16, split=1, warps=4, prefetch=False, out_dtype=None):
    m, n = x.shape[0], w8.shape[0]
    y = torch.full((m, n), float("nan"), dtype=out_dtype or torch.float32, device=x.device)
    part = torch.empty(max(1, split) * m * n, device=x.device)
    cnt = torch.zeros(triton_cdiv(n, block_n), dtype=torch.int32, device=x.device)
    fp8_int.fp8_int_gemv(x, w8, scale, bias, y, block_n, block_k4, split, warps, part, cnt, prefetch)
    return y, cnt


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_each_byte_lane_decodes_every_e4m3_value_exactly() -> None:
    """x one-hot at k = 0..3 (the four bytes of a weight word) picks one weight column: the output is
    that column dequantized, exactly (fp32), for all 254 e4m3 values; a wrong byte order or shift fails."""
    vals = _all_e4m3_bytes()
    n, k = 254, 64
    gen = torch.Generator().manual_seed(1)
    cols = torch.stack([vals[torch.randperm(254, generator=gen)] for _ in range(k)], dim=1)  # [n, k]
    w8 = cols.contiguous().view(FP8).to(DEVICE)
    scale = torch.ones(n, device=DEVICE)
    for lane in range(8):  # two words: k = 0..7
        x = torch.zeros(1, k, dtype=torch.bfloat16, device=DEVICE)
        x[0, lane] = 1.0
        y, _ = _run(x, w8, scale)
        assert torch.equal(y[0], w8[:, lane].float()), f"lane {lane}"


@pytest.mark.parametrize("m, split, prefetch, bias", [(1, 1, False, False), (1, 2, True, True),
                                                      (2, 1, True, False), (3, 2, False, True),
                                                      (4, 1, False, True), (4, 3, True, False)])
def test_matches_float64_reference_on_all_e4m3_values(m: int, split: int, prefetch: bool, bias: bool) -> None:
    vals = _all_e4m3_bytes()
    gen = torch.Generator().manual_seed(m * 10 + split)
    n, k = 37, 200  # ragged N; K4 = 50 words: the last chunk of 16 words is partial
    w8 = vals[torch.randint(0, len(vals), (n, k), generator=gen)].view(FP8).to(DEVICE)
    scale = (torch.rand(n, generator=gen) * 4 + 0.01).to(DEVICE)
    x = (torch.randn(m, k, generator=gen) * 3).to(torch.bfloat16).to(DEVICE)
    b = torch.randn(n, generator=gen).to(DEVICE) if bias else None
    y, cnt = _run(x, w8, scale, b, split=split, prefetch=prefetch)
    wf = w8.double() * scale.double()[:, None]
    ref = x.double() @ wf.t() + (b.double() if bias else 0.0)
    bound = x.double().abs() @ wf.abs().t()
    assert not torch.isnan(y).any()
    assert ((y.double() - ref).abs() <= 1e-6 * bound + 1e-30).all()
    assert (cnt == 0).all()  # the serial split-K counters are left ready for the next call


def test_bf16_output_and_bias_dtype() -> None:
    gen = torch.Generator().manual_seed(3)
    n, k = 24, 128
    w = torch.randn(n, k, generator=gen)
    scale = w.abs().amax(1) / 448
    w8 = (w / scale[:, None]).to(FP8).to(DEVICE)
    x = torch.randn(2, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    b = torch.randn(n, generator=gen).to(torch.bfloat16).to(DEVICE)
    y, _ = _run(x, w8, scale.to(DEVICE), b, out_dtype=torch.bfloat16)
    ref = x.float() @ (w8.float() * scale.to(DEVICE)[:, None]).t() + b.float()
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref.to(torch.bfloat16).float(), atol=1e-2, rtol=8e-3)


def test_supported_inputs() -> None:
    w8 = torch.zeros(8, 64, dtype=FP8)
    assert fp8_int.int_supported(torch.zeros(1, 64, dtype=torch.bfloat16), w8)
    assert not fp8_int.int_supported(torch.zeros(5, 64, dtype=torch.bfloat16), w8)  # M > 4
    assert not fp8_int.int_supported(torch.zeros(1, 64, dtype=torch.float16), w8)  # bf16 x only
    assert not fp8_int.int_supported(torch.zeros(1, 66, dtype=torch.bfloat16), torch.zeros(8, 66, dtype=FP8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n, k", [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944)])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_qwen_shapes_gpu(n: int, k: int, m: int) -> None:
    from radixrt.models.quant.fp8 import quantize_per_channel

    w8, scale = quantize_per_channel(torch.randn(n, k, device="cuda") * 0.02)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = x.double() @ (w8.double() * scale.double()[:, None]).t()
    bound = x.double().abs() @ (w8.double().abs() * scale.double()[:, None]).t()
    for cfg in [(8, 256, 4, 1, False), (16, 128, 4, 1, True), (8, 128, 4, 2, False)]:
        bn, bk4, warps, split, pf = cfg
        y, cnt = _run(x, w8, scale, None, bn, bk4, split, warps, pf)
        assert ((y.double() - ref).abs() <= 1e-6 * bound + 1e-30).all(), cfg
        y2, _ = _run(x, w8, scale, None, bn, bk4, split, warps, pf)
        assert torch.equal(y, y2), cfg  # deterministic, split-K included
