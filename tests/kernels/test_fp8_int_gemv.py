"""The cvt-free FP8 GEMV (kernels/gemv_fp8_int.py, the FP8 decode linear at M <= 2 on CUDA): e4m3
bytes turned into float32 bits with integer ops (value x 2^-120), x (bf16) scaled by 2^48, the
scale by 2^72; and its routing.

CPU through the Triton interpreter: the kernel only moves bf16 and e4m3 bits and computes in fp32, so
the interpreter's bf16 arithmetic is never used. Outputs are checked in fp32 against a float64
reference on the same bytes, including every non-NaN e4m3 value (subnormals, +-0, +-448). Kept to
few, large programs (the interpreter's cost is per program); the 7B shapes, graph capture and the
routed Fp8Linear are GPU tests (test_fp8_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import gemv_fp8_int as G8
from radixrt.kernels.gemv import SkinnyWorkspace

from .conftest import DEVICE

FP8 = torch.float8_e4m3fn
SHAPES_7B = [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944)]  # qkv, o, gate_up, down


def _all_e4m3_bytes() -> torch.Tensor:
    b = torch.arange(256, dtype=torch.int32)
    return b[(b & 0x7F) != 0x7F].to(torch.uint8)  # 254 values: NaNs (0x7F, 0xFF) left out


def _run(x, w8, scale, bias=None, block_n=64, block_k4=16, split=1, prefetch=False):
    """fp32 output through the raw launcher, poisoned with NaN first; returns (y, counters)."""
    m, n = x.shape[0], w8.shape[0]
    y = torch.full((m, n), float("nan"), dtype=torch.float32, device=x.device)
    ws = SkinnyWorkspace.allocate(split * m * n, -(-n // block_n), x.device)
    G8.fp8_int_gemv(x, w8, scale, bias, y, block_n, block_k4, split, 4, ws.partials, ws.counters, prefetch)
    return y, ws.counters


def test_each_byte_lane_decodes_every_e4m3_value_exactly() -> None:
    """Row r of x is one-hot at k = r (r = 0..3: the four bytes of the first weight word), so output
    row r is weight column r dequantized, exactly (fp32), for all 254 e4m3 values in each column
    (ragged: 254 rows in one 256-row block); a wrong byte order, shift or mask fails. M = 4 also runs
    the kernel's row unrolling to the end."""
    vals = _all_e4m3_bytes()
    n, k = 254, 64
    gen = torch.Generator().manual_seed(1)
    cols = torch.stack([vals[torch.randperm(254, generator=gen)] for _ in range(k)], dim=1)  # [n, k]
    w8 = cols.contiguous().view(FP8).to(DEVICE)
    x = torch.eye(4, k, dtype=torch.bfloat16, device=DEVICE)
    y, _ = _run(x, w8, torch.ones(n, device=DEVICE), block_n=256)
    for lane in range(4):
        assert torch.equal(y[lane], w8[:, lane].float()), f"lane {lane}"


@pytest.mark.parametrize("m, split, prefetch, bias", [(1, 2, True, True), (2, 3, False, False)])
def test_matches_float64_reference_on_all_e4m3_values(m: int, split: int, prefetch: bool, bias: bool) -> None:
    """Ragged N (37 rows in blocks of 32) and K (50 words in chunks of 16: the last one partial),
    split-K through the serial fix-up, within 1e-6 of sum |x||w|."""
    vals = _all_e4m3_bytes()
    gen = torch.Generator().manual_seed(m * 10 + split)
    n, k = 37, 200
    w8 = vals[torch.randint(0, len(vals), (n, k), generator=gen)].view(FP8).to(DEVICE)
    scale = (torch.rand(n, generator=gen) * 4 + 0.01).to(DEVICE)
    x = (torch.randn(m, k, generator=gen) * 3).to(torch.bfloat16).to(DEVICE)
    b = torch.randn(n, generator=gen).to(DEVICE) if bias else None
    y, cnt = _run(x, w8, scale, b, block_n=32, split=split, prefetch=prefetch)
    wf = w8.double() * scale.double()[:, None]
    ref = x.double() @ wf.t() + (b.double() if bias else 0.0)
    bound = x.double().abs() @ wf.abs().t()
    assert not torch.isnan(y).any()
    assert ((y.double() - ref).abs() <= 1e-6 * bound + 1e-30).all()
    assert (cnt == 0).all()  # the serial split-K counters are left ready for the next call


def test_supported_inputs() -> None:
    w8 = torch.zeros(8, 64, dtype=FP8)
    assert G8.int_supported(torch.zeros(1, 64, dtype=torch.bfloat16), w8)
    assert not G8.int_supported(torch.zeros(5, 64, dtype=torch.bfloat16), w8)  # M > 4
    assert not G8.int_supported(torch.zeros(1, 64, dtype=torch.float16), w8)  # bf16 x only
    assert not G8.int_supported(torch.zeros(1, 64, dtype=torch.bfloat16), w8.to(torch.bfloat16))
    assert not G8.int_supported(torch.zeros(1, 66, dtype=torch.bfloat16), torch.zeros(8, 66, dtype=FP8))
    assert not G8.int_supported(torch.zeros(1, 65, dtype=torch.bfloat16)[:, 1:], w8)  # x not 8-byte aligned


@pytest.mark.parametrize("n, k", SHAPES_7B)
def test_decode_rows_on_cuda_route_to_the_int_kernel(n: int, k: int) -> None:
    """M = 1, 2 on CUDA take the measured configs (split-free: split-K lost on the H200); M >= 3 and
    other devices stay on skinny_linear."""
    for m in (1, 2):
        cfg = G8.int_routed(m, n, k, "cuda")
        assert cfg is not None and cfg == G8.FP8_INT_TUNED[(m, n, k)]
        assert G8.int_workspace_need(cfg, m, n, k) == (0, 0)
        assert G8.int_routed(m, n, k, "cpu") is None
    for m in (3, 4, 16):
        assert G8.int_routed(m, n, k, "cuda") is None


def test_default_rule() -> None:
    """The rule gives the table's configs at the measured shapes, and split-free configs elsewhere."""
    for (m, n, k), cfg in G8.FP8_INT_TUNED.items():
        assert cfg.split_k == 1 and not cfg.prefetch and cfg.num_warps == 4
        rest = {key: v for key, v in G8.FP8_INT_TUNED.items() if key != (m, n, k)}
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(G8, "FP8_INT_TUNED", rest)
            assert G8.fp8_int_config(m, n, k) == cfg
    for m in (1, 2):
        for n, k in [(896, 896), (1536, 8960), (28672, 4096), (6144, 4096), (24, 64)]:
            cfg = G8.fp8_int_config(m, n, k)
            assert cfg.split_k == 1 and cfg.block_k4 <= max(1, k // 4) * 2
    assert G8.int_routed(1, 64, 66, "cuda") is None  # K % 4


def test_fp8_skinny_linear_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """With routing opened to this device: M = 1 and 2 launch the int kernel (bf16 output and bias,
    the default rule's config on a small shape), M = 3 calls skinny_linear."""
    launched, skinny = [], []
    raw, route = G8.fp8_int_gemv, G8.int_routed
    monkeypatch.setattr(G8, "fp8_int_gemv", lambda *a: launched.append(a[5:7]) or raw(*a))
    monkeypatch.setattr(G8, "int_routed", lambda m, n, k, dev: route(m, n, k, "cuda"))
    monkeypatch.setattr(G8, "skinny_linear", lambda *a, **kw: skinny.append(a[0].shape[0]))
    gen = torch.Generator().manual_seed(3)
    n, k = 24, 128
    w = torch.randn(n, k, generator=gen)
    scale = (w.abs().amax(1) / 448).to(DEVICE)
    w8 = (w.to(DEVICE) / scale[:, None]).to(FP8)
    b = torch.randn(n, generator=gen).to(torch.bfloat16).to(DEVICE)
    x = torch.randn(2, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    y = G8.fp8_skinny_linear(x, w8, scale, b)
    cfg = G8.fp8_int_config(2, n, k)
    assert launched == [(cfg.block_n, cfg.block_k4)] and not skinny
    ref = x.float() @ (w8.float() * scale[:, None]).t() + b.float()
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref.to(torch.bfloat16).float(), atol=1e-2, rtol=8e-3)
    G8.fp8_skinny_linear(x[:1], w8, scale, b)
    assert len(launched) == 2 and not skinny
    G8.fp8_skinny_linear(torch.zeros(3, k, dtype=torch.bfloat16, device=DEVICE), w8, scale, b)
    assert len(launched) == 2 and skinny == [3]
