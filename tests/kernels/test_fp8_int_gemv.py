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


def _fp8_weight(n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(n, k, generator=gen)
    scale = (w.abs().amax(1) / 448).to(DEVICE)
    return (w.to(DEVICE) / scale[:, None]).to(FP8), scale


def _norm_chain_operands(m: int, bias: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    k1, hidden, n2 = 96, 72, 40
    w1, s1 = _fp8_weight(hidden, k1, gen)
    w2, s2 = _fp8_weight(n2, hidden, gen)
    b1 = torch.randn(hidden, generator=gen).to(torch.bfloat16).to(DEVICE) if bias else None
    b2 = torch.randn(n2, generator=gen).to(torch.bfloat16).to(DEVICE) if bias else None
    x = torch.randn(m, k1, generator=gen).to(torch.bfloat16).to(DEVICE)
    res = (torch.randn(m, hidden, generator=gen) * 2).to(torch.bfloat16).to(DEVICE)
    gamma = (torch.rand(hidden, generator=gen) + 0.5).to(torch.bfloat16).to(DEVICE)
    return x, w1, s1, b1, res, gamma, w2, s2, b2


def _rms_linear_ref(h, gamma, eps, w2, s2, b2):
    """(linear of rms_norm(h) * gamma in float64, the bound sum |normed| |w|)."""
    hd = h.double()
    normed = hd * torch.rsqrt(hd.pow(2).mean(1, keepdim=True) + eps) * gamma.double()
    wd = w2.double() * s2.double()[:, None]
    ref = normed @ wd.t() + (b2.double() if b2 is not None else 0.0)
    return ref, normed.abs() @ wd.abs().t()


@pytest.mark.parametrize("m, bias", [(1, True), (2, False)])
def test_norm_split_across_two_linears_matches_the_unfused_chain(m: int, bias: bool) -> None:
    """linear -> residual add + RMSNorm -> linear with the norm in the two int GEMVs' epilogues
    (NORM_OUT / NORM_IN), through the raw launcher with a float32 stream (the interpreter rounds
    float32 -> bf16 wrongly): h is the unfused linear's output (same kernel, same config) plus the
    residual, bit for bit; g = h * gamma exactly; each partial sum of squares is its 16 channels'
    (N = 72 in blocks of 16: 5 per row, the last half empty); the second linear of g rounded to bf16
    equals rms_norm(h) * gamma's linear up to that rounding and fp32 sums."""
    x, w1, s1, b1, res, gamma, w2, s2, b2 = _norm_chain_operands(m, bias, 7 + m)
    hidden, n2, eps = w1.shape[0], w2.shape[0], 1e-6
    f32 = dict(dtype=torch.float32, device=DEVICE)
    v = torch.empty(m, hidden, **f32)
    G8.fp8_int_gemv(x, w1, s1, b1, v, 16, 8, 1, 4)  # the unfused linear
    g, h, sq = torch.empty(m, hidden, **f32), torch.empty(m, hidden, **f32), torch.full((m, 5), -1.0, **f32)
    G8.fp8_int_gemv(x, w1, s1, b1, g, 16, 8, 1, 4, norm_out=(res.float(), gamma, h, sq))
    assert torch.equal(h, v + res.float())
    assert torch.equal(g, h * gamma.float())
    hp = torch.nn.functional.pad(h, (0, 8)).view(m, 5, 16)
    torch.testing.assert_close(sq, hp.pow(2).sum(2), rtol=1e-6, atol=0)

    gb = g.to(torch.bfloat16)
    y = torch.empty(m, n2, **f32)
    G8.fp8_int_gemv(gb, w2, s2, b2, y, 8, 8, 1, 4, norm_in=(sq, eps))
    rstd = torch.rsqrt(h.double().pow(2).mean(1, keepdim=True) + eps)
    wd = w2.double() * s2.double()[:, None]
    ref = rstd * (gb.double() @ wd.t()) + (b2.double() if bias else 0.0)
    bound = rstd * (gb.double().abs() @ wd.abs().t())
    assert ((y.double() - ref).abs() <= 1e-5 * bound + 1e-6).all()
    ref_norm, bound_norm = _rms_linear_ref(h, gamma, eps, w2, s2, b2)
    assert ((y.double() - ref_norm).abs() <= 2 ** -8 * bound_norm + 1e-6).all()

    # SQ_LAST: the last program sums the partial sums (one value per row), the counter left zero
    counters = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    total = torch.full((m, 1), -1.0, **f32)
    g2, h2, sq2 = torch.empty_like(g), torch.empty_like(h), torch.full((m, 5), -1.0, **f32)
    G8.fp8_int_gemv(x, w1, s1, b1, g2, 16, 8, 1, 4, counters=counters, norm_out=(res.float(), gamma, h2, sq2),
                    sq_total=total)
    assert torch.equal(h2, h) and torch.equal(g2, g) and torch.equal(sq2, sq) and int(counters[0]) == 0
    torch.testing.assert_close(total[:, 0], sq.sum(1), rtol=1e-6, atol=0)
    y2 = torch.empty(m, n2, **f32)
    G8.fp8_int_gemv(gb, w2, s2, b2, y2, 8, 8, 1, 4, norm_in=(total, eps))
    torch.testing.assert_close(y2, y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m", [1, 2])
def test_fused_norm_entry_points(m: int) -> None:
    """fp8_int_gemv_norm_out / _norm_in in bf16 (their outputs allocated, P from the config): the
    chain's result is the linear of rms_norm(v + residual) * gamma within bf16 roundings (two steps:
    the interpreter truncates)."""
    x, w1, s1, b1, res, gamma, w2, s2, b2 = _norm_chain_operands(m, True, 11 + m)
    eps = 1e-5
    g, h, sq = G8.fp8_int_gemv_norm_out(x, w1, s1, b1, res, gamma, config=G8.Fp8IntConfig(32, 8))
    assert g.dtype == h.dtype == torch.bfloat16 and sq.shape == (m, 3) and sq.dtype == torch.float32
    counters = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    g_last, h_last, total = G8.fp8_int_gemv_norm_out(x, w1, s1, b1, res, gamma, config=G8.Fp8IntConfig(32, 8),
                                                     counters=counters)
    assert torch.equal(g_last, g) and torch.equal(h_last, h) and total.shape == (m, 1)
    torch.testing.assert_close(total[:, 0], sq.sum(1), rtol=1e-6, atol=0)
    assert int(counters[0]) == 0
    v = x.double() @ (w1.double() * s1.double()[:, None]).t() + b1.double()
    assert ((h.double() - (v + res.double())).abs() <= 2 ** -6 * (v.abs() + res.double().abs()) + 1e-3).all()
    y = G8.fp8_int_gemv_norm_in(g, sq, eps, w2, s2, b2, config=G8.Fp8IntConfig(8, 8))
    ref, bound = _rms_linear_ref(h, gamma, eps, w2, s2, b2)
    assert y.shape == (m, w2.shape[0]) and y.dtype == torch.bfloat16
    assert ((y.double() - ref).abs() <= 2 ** -6 * bound + 2 ** -6 * ref.abs() + 1e-3).all()


def test_fused_norm_refuses_calls_it_cannot_take() -> None:
    """M > 2, a split-K config or a residual of the wrong shape: ValueError, nothing launched."""
    gen = torch.Generator().manual_seed(1)
    w, s = _fp8_weight(32, 64, gen)
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16).to(DEVICE)
    res = torch.zeros(3, 32, dtype=torch.bfloat16, device=DEVICE)
    gamma = torch.ones(32, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="fused norm"):
        G8.fp8_int_gemv_norm_out(x, w, s, None, res, gamma, config=G8.Fp8IntConfig(16, 8))
    with pytest.raises(ValueError, match="fused norm"):
        G8.fp8_int_gemv_norm_out(x[:1], w, s, None, res[:1], gamma, config=G8.Fp8IntConfig(16, 8, split_k=2))
    with pytest.raises(ValueError, match="residual"):
        G8.fp8_int_gemv_norm_out(x[:1], w, s, None, res[:, :16], gamma, config=G8.Fp8IntConfig(16, 8))
    with pytest.raises(ValueError, match="sq"):
        G8.fp8_int_gemv_norm_in(x[:1], torch.zeros(2, 4), 1e-6, torch.zeros(8, 64, dtype=FP8),
                                torch.ones(8, device=DEVICE), config=G8.Fp8IntConfig(8, 8))
    assert G8.norm_fusable(1, 3584, 18944, "cuda") == G8.FP8_INT_TUNED[(1, 3584, 18944)]
    assert G8.norm_fusable(1, 3584, 18944, "cpu") is None and G8.norm_fusable(3, 3584, 3584, "cuda") is None
