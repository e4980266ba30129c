"""The warp-specialized Gluon decode-batch GEMM (kernels/gemm_ws.py) on a Hopper GPU against the
fp32 product of the same operands: batch rows 17 .. 128 (every MP bucket, rows that fill it and rows
that do not; 16, 129 and 256 refused), one split and several (the per-thread split-K fix-up), with
and without a bias, bf16 and fp16, N not a multiple of the tile, K not a multiple of the step (TMA's
zero fill), an output with a row stride of its own; repeated calls leave the counters at zero and
give bit-equal results (split order fixed); a CUDA graph replays it with new inputs; the SwiGLU
form (gemm_silu_ws) against silu(x Wg^T) * (x Wu^T) in fp32, with a partial last tile and nothing
written outside its output; the Linear routing takes both only inside decode-graph calls and where
asked. Weights of standard deviation
1 / sqrt(K): each output of ~unit size, so a dropped split or a wrong row is far outside the
tolerance (relative error 1e-2; fp32 accumulation of bf16 products gives ~3e-3)."""

from __future__ import annotations

import pytest
import torch

from .conftest import requires_hopper

pytestmark = requires_hopper


def _ws():
    from radixrt.kernels import gemm_ws

    return gemm_ws


def make(m: int, n: int, k: int, dtype=torch.bfloat16, bias: bool = False, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    dev = torch.device("cuda")
    return x.to(dev), w.to(dev), None if b is None else b.to(dev)


def ref(x, w, b):
    y = x.float() @ w.float().t()
    return y + b.float() if b is not None else y


def rel(a, b) -> float:
    """Relative error of the whole matrix, after an element-wise check (a dropped split of one
    thread's rows moves the matrix norm by < 1% but those elements by their full size)."""
    torch.testing.assert_close(a.float(), b, atol=2e-2, rtol=2e-2)
    return ((a.float() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("m", [17, 32, 33, 64, 100, 128])
@pytest.mark.parametrize("splits", [1, 3])
def test_rows_and_splits(m, splits):
    ws = _ws()
    x, w, b = make(m, 1000, 1536, bias=True)  # 8 row tiles of 128, the last one 104 rows short
    cfg = ws.GemmWsConfig(block_n=128, block_k=64, stages=3, splits=splits)
    y = ws.gemm_ws(x, w, b, config=cfg)
    assert y.shape == (m, 1000) and y.dtype == x.dtype
    assert rel(y, ref(x, w, b)) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_n,block_k,stages,splits", [(128, 64, 4, 1), (128, 128, 3, 4), (64, 64, 4, 6),
                                                           (64, 128, 2, 2), (256, 64, 4, 1), (256, 64, 3, 5)])
def test_configs(dtype, block_n, block_k, stages, splits):
    ws = _ws()
    # K = 2000: a last step of 16 or 80 columns
    x, w, b = make(96, 640, 2000, dtype=dtype, bias=False, seed=1)
    y = ws.gemm_ws(x, w, b, config=ws.GemmWsConfig(block_n, block_k, stages, splits))
    assert rel(y, ref(x, w, b)) < 1e-2


@pytest.mark.parametrize("m,k,cfg", [(20, 64 * 5, (64, 64, 2, 5)),  # one step per split, BN 64 at MP 32
                                     (17, 64, (128, 64, 3, 1)),  # a single step in all
                                     (40, 640, (64, 128, 2, 5))])
def test_one_step_per_split(m, k, cfg):
    ws = _ws()
    x, w, b = make(m, 300, k, bias=True, seed=8)
    y = ws.gemm_ws(x, w, b, config=ws.GemmWsConfig(*cfg))
    assert rel(y, ref(x, w, b)) < 1e-2


def test_rows_outside_the_range_are_refused():
    ws = _ws()
    for m in (16, 129, 256):
        x, w, _ = make(m, 256, 512)
        assert not ws.supported(x, w)
        with pytest.raises(ValueError):
            ws.gemm_ws(x, w)


def test_split_k_counters_reset_and_results_repeat():
    ws = _ws()
    x, w, b = make(128, 4608, 3584, bias=True, seed=2)
    cfg = ws.GemmWsConfig(128, 64, 4, 4)
    need_p, need_c = ws.workspace_need(cfg, 128, 4608, 3584)
    partials = torch.full((need_p,), float("nan"), device="cuda")
    counters = torch.zeros(need_c, dtype=torch.int32, device="cuda")
    first = ws.gemm_ws(x, w, b, config=cfg, partials=partials, counters=counters)
    assert rel(first, ref(x, w, b)) < 1e-2
    assert int(counters.abs().sum()) == 0
    for _ in range(20):
        again = ws.gemm_ws(x, w, b, config=cfg, partials=partials, counters=counters)
        assert torch.equal(again, first)
    assert int(counters.abs().sum()) == 0


@pytest.mark.parametrize("splits", [1, 2])
def test_out_with_row_stride_and_nothing_written_outside(splits):
    ws = _ws()
    x, w, b = make(48, 500, 1024, bias=True, seed=3)  # N = 500: a last tile of 116 rows; M 48 of MP 64
    big = torch.full((64, 700), 7.0, dtype=x.dtype, device="cuda")
    out = big[:48, 100:600]
    ws.gemm_ws(x, w, b, out=out, config=ws.GemmWsConfig(128, 64, 3, splits))
    assert rel(out, ref(x, w, b)) < 1e-2
    assert bool((big[:, :100] == 7).all()) and bool((big[:, 600:] == 7).all()) and bool((big[48:] == 7).all())


def test_cuda_graph_replays_with_new_inputs():
    ws = _ws()
    x, w, b = make(128, 3584, 3584, bias=False, seed=4)
    cfg = ws.default_config(128, 3584, 3584)
    need_p, need_c = ws.workspace_need(cfg, 128, 3584, 3584)
    partials = torch.empty(max(need_p, 1), device="cuda")
    counters = torch.zeros(max(need_c, 1), dtype=torch.int32, device="cuda")
    out = torch.empty(128, 3584, dtype=x.dtype, device="cuda")
    ws.gemm_ws(x, w, None, out=out, config=cfg, partials=partials, counters=counters)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ws.gemm_ws(x, w, None, out=out, config=cfg, partials=partials, counters=counters)
    for seed in (5, 6):
        x.copy_(make(128, 3584, 3584, seed=seed)[0])
        graph.replay()
        torch.cuda.synchronize()
        assert rel(out, ref(x, w, None)) < 1e-2
    assert int(counters.abs().sum()) == 0


def silu_ref(x, w):
    inter = w.shape[0] // 2
    y = x.float() @ w.float().t()
    return torch.nn.functional.silu(y[:, :inter]) * y[:, inter:]


@pytest.mark.parametrize("m,inter,k,cfg", [(128, 18944 // 8, 3584, (128, 64, 4, 1)),
                                           (17, 200, 1024, (128, 128, 3, 1)),  # a last tile of 8 gate rows
                                           (64, 96, 640, (64, 64, 2, 1)),  # BN 64: 32 gate + 32 up rows
                                           (100, 300, 1024, (256, 64, 4, 1))])  # two warpgroups
def test_silu_gated(m, inter, k, cfg):
    ws = _ws()
    x, w, _ = make(m, 2 * inter, k, seed=9)
    big = torch.full((m + 3, inter + 50), 7.0, dtype=x.dtype, device="cuda")
    out = big[:m, 20:20 + inter]
    ws.gemm_silu_ws(x, w, out=out, config=ws.GemmWsConfig(*cfg))
    assert rel(out, silu_ref(x, w)) < 1e-2
    assert bool((big[:, :20] == 7).all()) and bool((big[:, 20 + inter:] == 7).all())
    assert bool((big[m:] == 7).all())
    with pytest.raises(ValueError):  # split K is not taken
        ws.gemm_silu_ws(x, w, config=ws.GemmWsConfig(cfg[0], cfg[1], cfg[2], 4))


def test_linear_silu_and_mul_routes_to_the_fused_form(monkeypatch):
    from radixrt.models import linear as L

    ws = _ws()
    calls = []
    real = ws.gemm_silu_ws
    monkeypatch.setattr(ws, "gemm_silu_ws", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    x, w, _ = make(96, 2 * 512, 1024, seed=10)
    lin = L.Linear(1024, 1024, bias=False, device="cuda", dtype=torch.bfloat16)
    lin.gated = True
    with torch.no_grad():
        lin.weight.copy_(w)
    monkeypatch.setenv("RADIXRT_GEMM_WS", "all")
    unfused = lin.silu_and_mul(x)
    with L.decode_graph_calls():
        fused = lin.silu_and_mul(x)
    assert calls == [96]
    assert rel(fused, silu_ref(x, w)) < 1e-2 and rel(unfused, silu_ref(x, w)) < 1e-2


def test_silu_and_mul_takes_the_fused_form_only_where_tuned_gated(monkeypatch):
    """RADIXRT_GEMM_WS=auto: a gate_up shape listed in TUNED but not TUNED_GATED runs the Gluon GEMM
    and then the SiLU kernel (the fused form was not measured faster there); listed in TUNED_GATED,
    one gemm_silu_ws launch with that entry's config."""
    from radixrt.models import linear as L

    ws = _ws()
    plain, gated = [], []
    real_plain, real_gated = ws.gemm_ws, ws.gemm_silu_ws
    monkeypatch.setattr(ws, "gemm_ws", lambda *a, **kw: plain.append(kw["config"]) or real_plain(*a, **kw))
    monkeypatch.setattr(ws, "gemm_silu_ws",
                        lambda *a, **kw: gated.append(kw["config"]) or real_gated(*a, **kw))
    x, w, _ = make(96, 1024, 640, seed=8)
    lin = L.Linear(640, 1024, bias=False, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(w)
    shape = (ws.rows_padded(96), 1024, 640)
    monkeypatch.setattr(ws, "TUNED", {shape: ws.GemmWsConfig(128, 64, 4, 2)})
    monkeypatch.setattr(ws, "TUNED_GATED", {})
    monkeypatch.setenv("RADIXRT_GEMM_WS", "auto")
    with L.decode_graph_calls():
        unfused = lin.silu_and_mul(x)
    assert gated == [] and plain == [ws.GemmWsConfig(128, 64, 4, 2)]
    plain.clear()
    monkeypatch.setattr(ws, "TUNED_GATED", {shape: ws.GemmWsConfig(64, 64, 3, 1)})
    with L.decode_graph_calls():
        fused = lin.silu_and_mul(x)
    assert plain == [] and gated == [ws.GemmWsConfig(64, 64, 3, 1)]
    assert rel(fused, silu_ref(x, w)) < 1e-2 and rel(unfused, silu_ref(x, w)) < 1e-2


def test_linear_routes_graph_calls_only_where_asked(monkeypatch):
    from radixrt.models import linear as L

    ws = _ws()
    calls = []
    real = ws.gemm_ws
    monkeypatch.setattr(ws, "gemm_ws", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    x, w, b = make(128, 1024, 2048, bias=True, seed=7)
    lin = L.Linear(2048, 1024, bias=True, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    monkeypatch.setenv("RADIXRT_GEMM_WS", "all")
    eager = lin(x)  # outside a decode graph: never routed (its TMA descriptors cost host time per call)
    assert calls == []
    with L.decode_graph_calls():
        warm = lin(x)  # a graph's warm-up: routed, and the shared workspace allocated
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = lin(x)
    graph.replay()
    torch.cuda.synchronize()
    assert calls == [128, 128]
    for got in (eager, warm, y):
        assert rel(got, ref(x, w, b)) < 1e-2
    calls.clear()
    monkeypatch.setattr(ws, "TUNED", {})
    monkeypatch.setenv("RADIXRT_GEMM_WS", "auto")  # a shape its TUNED table does not list
    with L.decode_graph_calls():
        lin(x)
    monkeypatch.setenv("RADIXRT_GEMM_WS", "0")
    with L.decode_graph_calls():
        lin(x)
    assert calls == []
