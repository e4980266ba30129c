"""skinny_linear (decode GEMV) against the fp32 torch reference: both inner products (reduce, dot),
split-K with the serial fix-up and with the second reduction kernel, bias, ragged N and K, leading
dims, a reused workspace, argument errors; the dot path at M = 17..256 (BM = next_pow2(M)) and its
routing (only shapes TUNED lists); and the Qwen2.5-7B linears in bf16 on a GPU.

Tolerances (fp32 accumulation, reference in fp32 from the same inputs): CPU fp32 atol = rtol = 1e-4
(sums of up to 160 products of N(0, 1) values, ~13 in magnitude, differ only in summation order);
fp16 atol = rtol = 2e-3 (about one fp16 ulp of the output); GPU bf16 ||y - ref|| / ||ref|| <= 1e-2
and |y - ref| <= 2e-2 + 2e-2 |ref|.
"""

from __future__ import annotations

import pytest
import torch
import triton

from radixrt.kernels import SkinnyConfig, SkinnyWorkspace, gemv, skinny_linear, skinny_linear_supported
from radixrt.kernels.gemv import (
    default_config,
    programs_per_sm,
    shared_memory_bytes,
    skinny_linear_compile,
    skinny_rows_routed,
)
from radixrt.kernels.reference import skinny_linear_ref

TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3)}

REDUCE = SkinnyConfig(block_n=16, block_k=32)
REDUCE_SPLIT = SkinnyConfig(block_n=8, block_k=32, split_k=3)
DOT_SPLIT = SkinnyConfig(block_n=32, block_k=32, split_k=2, use_dot=True)
TWO_KERNEL_SPLIT = SkinnyConfig(block_n=16, block_k=16, split_k=4, serial_reduce=False)


def _randn(*shape, dtype, device, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype=dtype, device=device)


def _inputs(m, n, k, dtype, device, with_bias=True):
    x = _randn(m, k, dtype=dtype, device=device, seed=1)
    w = _randn(n, k, dtype=dtype, device=device, seed=2)
    b = _randn(n, dtype=dtype, device=device, seed=3) if with_bias else None
    return x, w, b


@pytest.mark.parametrize("cfg", [REDUCE, REDUCE_SPLIT, DOT_SPLIT, TWO_KERNEL_SPLIT],
                         ids=["reduce", "reduce-split3", "dot-split2", "two-kernel-split4"])
@pytest.mark.parametrize("m, n, k, dtype, with_bias", [
    (1, 48, 80, torch.float32, True),
    (3, 96, 160, torch.float16, False),
    (16, 96, 160, torch.float32, True),
    (5, 40, 72, torch.float16, True),  # N not a multiple of block_n, K not a multiple of 16 or block_k
])
def test_skinny_linear_matches_reference(device, close, cfg, m, n, k, dtype, with_bias):
    x, w, b = _inputs(m, n, k, dtype, device, with_bias)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    y = skinny_linear(x, w, b, out=out, config=cfg)
    assert y is out
    close(y, skinny_linear_ref(x, w, b), *TOL[dtype])


def test_default_config_and_leading_dims(device, close):
    """No config: the default rules; x [2, 3, K] gives y [2, 3, N]."""
    x = _randn(2, 3, 64, dtype=torch.float32, device=device, seed=4)
    w = _randn(48, 64, dtype=torch.float32, device=device, seed=5)
    y = skinny_linear(x, w)
    assert y.shape == (2, 3, 48)
    close(y, skinny_linear_ref(x, w), *TOL[torch.float32])


def test_workspace_reused_across_calls_and_shapes(device, close):
    """One workspace serves split-K calls of different shapes back to back: counters reset themselves."""
    ws = SkinnyWorkspace.allocate(4 * 16 * 96, 16, device)
    for m, n, k, cfg in [(1, 48, 80, REDUCE_SPLIT), (4, 96, 160, DOT_SPLIT), (1, 48, 80, REDUCE_SPLIT)]:
        x, w, b = _inputs(m, n, k, torch.float32, device)
        close(skinny_linear(x, w, b, config=cfg, workspace=ws), skinny_linear_ref(x, w, b), 1e-4, 1e-4)
        assert int(ws.counters.abs().sum()) == 0


def test_strided_x_rows(device, close):
    """x may be a row-strided view (e.g. every other token); only its last dim must be contiguous."""
    base = _randn(6, 80, dtype=torch.float32, device=device, seed=6)
    w = _randn(48, 80, dtype=torch.float32, device=device, seed=7)
    x = base[::2]
    close(skinny_linear(x, w, config=REDUCE_SPLIT), skinny_linear_ref(x, w), 1e-4, 1e-4)


def test_default_config_rules():
    """Rules (shapes TUNED will not list): row blocks x splits reach 4 programs per SM unless a split
    would drop below 4 chunks; wide matrices do not split; M > 2 takes the dot path."""
    for m, n, k in [(1, 3072, 16384), (1, 2048, 2048), (8, 3072, 16384), (2, 5120, 5120)]:
        cfg = default_config(m, n, k, num_sms=132)
        programs = -(-n // cfg.block_n) * cfg.split_k
        assert programs >= 4 * 132 or k < 2 * cfg.split_k * 4 * cfg.block_k, (m, n, k, cfg)
        assert cfg.split_k > 1
    assert default_config(1, 100000, 4096).split_k == 1
    assert not default_config(1, 2048, 2048).use_dot and default_config(8, 2048, 2048).use_dot


def test_supported():
    w = torch.zeros(48, 64)
    assert skinny_linear_supported(torch.zeros(16, 64), w)
    assert not skinny_linear_supported(torch.zeros(17, 64), w)  # too many rows
    assert not skinny_linear_supported(torch.zeros(1, 64, dtype=torch.float16), w)  # dtype mismatch
    assert not skinny_linear_supported(torch.zeros(1, 64), torch.zeros(64, 48).t())  # not contiguous
    assert not skinny_linear_supported(torch.zeros(1, 40), torch.zeros(48, 40))  # K % 16
    assert not skinny_linear_supported(torch.zeros(1, 32), w)  # K mismatch


@pytest.mark.parametrize("make, match", [
    (lambda: (torch.zeros(257, 64), torch.zeros(48, 64), None, None), "at most 256"),
    (lambda: (torch.zeros(1, 32), torch.zeros(48, 64), None, None), "K ="),
    (lambda: (torch.zeros(1, 64), torch.zeros(48, 64, dtype=torch.float16), None, None), "equal"),
    (lambda: (torch.zeros(1, 64, dtype=torch.int32), torch.zeros(48, 64, dtype=torch.int32), None, None),
     "float"),
    (lambda: (torch.zeros(1, 64), torch.zeros(64, 48).t(), None, None), "contiguous"),
    (lambda: (torch.zeros(64, 2)[:, 0].view(1, 64), torch.zeros(48, 64), None, None), "contiguous last dim"),
    (lambda: (torch.zeros(1, 64), torch.zeros(48, 64), torch.zeros(47), None), "bias"),
    (lambda: (torch.zeros(1, 64), torch.zeros(48, 64), None, torch.zeros(1, 47)), "out"),
    (lambda: (torch.zeros(1, 64), torch.zeros(48), None, None), r"\[N, K\]"),
])
def test_argument_errors(make, match):
    x, w, b, out = make()
    with pytest.raises(ValueError, match=match):
        skinny_linear(x, w, b, out=out)


def test_config_and_workspace_errors():
    with pytest.raises(ValueError, match="powers of two"):
        SkinnyConfig(block_n=24, block_k=64)
    with pytest.raises(ValueError, match="use_dot"):
        SkinnyConfig(block_n=8, block_k=64, use_dot=True)
    x, w = torch.zeros(1, 64), torch.zeros(48, 64)
    with pytest.raises(ValueError, match="workspace too small"):
        skinny_linear(x, w, config=SkinnyConfig(16, 16, split_k=2),
                      workspace=SkinnyWorkspace.allocate(8, 1, "cpu"))
    with pytest.raises(ValueError, match="reduce path"):  # M > 16 needs the dot path
        skinny_linear(torch.zeros(17, 64), w, config=SkinnyConfig(16, 16))
    with pytest.raises(ValueError, match="at most 256"):
        default_config(257, 48, 64)


# The dot path at M > 16: BM = next_pow2(M) (32, 64, 128) rows of x per tile, x padded by repeating
# its last row. Small N, K so the interpreter stays fast; N = 40 and K = 72 are ragged for every tile.
DOT = SkinnyConfig(block_n=32, block_k=32, use_dot=True)
DOT_SPLIT3 = SkinnyConfig(block_n=16, block_k=16, split_k=3, use_dot=True)
DOT_TWO_KERNEL = SkinnyConfig(block_n=32, block_k=16, split_k=2, use_dot=True, serial_reduce=False)


@pytest.mark.parametrize("cfg", [DOT, DOT_SPLIT3, DOT_TWO_KERNEL],
                         ids=["dot", "dot-split3", "dot-two-kernel-split2"])
@pytest.mark.parametrize("m, n, k, dtype, with_bias", [
    (17, 48, 64, torch.float32, True),  # BM = 32, one row past a power of two
    (32, 40, 72, torch.float16, False),  # ragged N and K
    (45, 96, 80, torch.float32, False),  # BM = 64
    (64, 40, 64, torch.float16, True),
])
def test_dot_path_large_m_matches_reference(device, close, cfg, m, n, k, dtype, with_bias):
    x, w, b = _inputs(m, n, k, dtype, device, with_bias)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    ws = SkinnyWorkspace.allocate(cfg.split_k * m * n, n, device)
    y = skinny_linear(x, w, b, out=out, config=cfg, workspace=ws)
    assert y is out and not torch.isnan(y).any()
    close(y, skinny_linear_ref(x, w, b), *TOL[dtype])
    assert int(ws.counters.abs().sum()) == 0


def test_dot_path_large_m_default_config_and_strided_rows(device, close):
    """No config at M = 100 (BM = 128): default_config's large-M rule; x a row-strided view with
    leading dims [4, 25]."""
    base = _randn(200, 48, dtype=torch.float32, device=device, seed=10)
    x = base[::2].view(4, 25, 48)
    w = _randn(24, 48, dtype=torch.float32, device=device, seed=11)
    b = _randn(24, dtype=torch.float32, device=device, seed=12)
    assert default_config(100, 24, 48).use_dot
    y = skinny_linear(x, w, b)
    assert y.shape == (4, 25, 24)
    close(y, skinny_linear_ref(x, w, b), *TOL[torch.float32])


def test_workspace_reused_across_m_buckets(device, close):
    """One workspace, dot split-K calls at M = 3 (BM 16), 40 (BM 64) and 20 (BM 32): counters reset."""
    ws = SkinnyWorkspace.allocate(3 * 40 * 48, 8, device)
    for m in (3, 40, 20):
        x, w, b = _inputs(m, 48, 64, torch.float32, device)
        close(skinny_linear(x, w, b, config=DOT_SPLIT3, workspace=ws), skinny_linear_ref(x, w, b), 1e-4, 1e-4)
        assert int(ws.counters.abs().sum()) == 0


def test_default_config_large_m_rules():
    """M of 17..256: dot path, shared memory <= 200 KB (2-byte inputs), fp32 accumulator <= 128
    registers per thread, split-K only while the grid stays within one wave of resident programs
    (1 or 2 per SM by shared memory) with >= 4 chunks per split and fp32 partials no larger than
    the weight; one config per m bucket."""
    shapes = [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944), (152064, 3584), (256, 512)]
    for m in (17, 32, 33, 64, 65, 128, 200, 256):
        bm = 1 << (m - 1).bit_length()
        for n, k in shapes:
            cfg = default_config(m, n, k, num_sms=132)
            assert cfg.use_dot and cfg == default_config(bm, n, k, num_sms=132), (m, n, k, cfg)
            assert shared_memory_bytes(cfg, m) <= 200 * 1024, (m, cfg)
            assert cfg.block_n * bm // (32 * cfg.num_warps) <= 128, (m, cfg)
            programs = -(-n // cfg.block_n) * cfg.split_k
            if cfg.split_k > 1:
                assert programs <= programs_per_sm(cfg, m) * 132, (m, n, k, cfg)
                assert k >= cfg.split_k * 4 * cfg.block_k, (m, n, k, cfg)
                assert cfg.split_k * bm * n * 4 <= n * k * 2, (m, n, k, cfg)
    assert default_config(128, 4608, 3584, num_sms=132) == SkinnyConfig(128, 64, 4, 4, 3, use_dot=True)
    assert default_config(256, 3584, 18944, num_sms=132) == SkinnyConfig(128, 64, 4, 8, 3, use_dot=True)
    assert default_config(256, 4608, 3584, num_sms=132).split_k == 2  # 144 KB: one program per SM
    assert default_config(64, 37888, 3584, num_sms=132).split_k == 1
    # M <= 16 unchanged by the large-M rule
    assert default_config(16, 2048, 2048, num_sms=132) == SkinnyConfig(64, 128, 4, 4, 4, use_dot=True)
    assert default_config(2, 2048, 2048, num_sms=132) == SkinnyConfig(16, 256, 2, 4, 1, use_dot=False)


def test_shared_memory_bytes():
    assert shared_memory_bytes(SkinnyConfig(64, 128, num_stages=4, use_dot=True),
                               8) == 4 * (16 + 64) * 128 * 2
    assert shared_memory_bytes(SkinnyConfig(128, 64, num_stages=3, use_dot=True),
                               200) == 3 * (256 + 128) * 64 * 2
    assert shared_memory_bytes(SkinnyConfig(16, 256), 1) == 0
    assert programs_per_sm(SkinnyConfig(128, 64, num_stages=3, use_dot=True), 128) == 2  # 96 KB
    assert programs_per_sm(SkinnyConfig(128, 64, num_stages=4, use_dot=True), 128) == 1  # 128 KB


def test_supported_large_m_only_with_tuned_entry(monkeypatch):
    """M > 16 is routed only where TUNED lists (next_pow2(M), N, K) with a dot config."""
    n, k = 48, 64
    w = torch.zeros(n, k)
    monkeypatch.setattr(gemv, "TUNED", {})
    for m in (17, 64, 65, 128, 256):
        assert not skinny_linear_supported(torch.zeros(m, k), w), m
        assert not skinny_rows_routed(m, n, k)
    assert skinny_linear_supported(torch.zeros(16, k), w)
    monkeypatch.setattr(gemv, "TUNED", {(128, n, k): SkinnyConfig(32, 32, use_dot=True),
                                        (32, n, k): SkinnyConfig(16,
                                                                 32),  # a reduce config cannot take M > 16
                                        (512, n, k): SkinnyConfig(32, 32, use_dot=True)})
    for m in (65, 100, 128):
        assert skinny_linear_supported(torch.zeros(m, k), w), m
        assert skinny_linear_supported(torch.zeros(m // 5, 5, k),
                                       w), m  # leading dims flattened (M = 5 * (m // 5))
    for m in (17, 32, 64, 129, 256, 257, 300):
        assert not skinny_linear_supported(torch.zeros(m, k), w), m
    assert not skinny_linear_supported(torch.zeros(100, k), torch.zeros(n + 16, k))  # other shape
    assert not skinny_linear_supported(torch.zeros(100, k, dtype=torch.float16), w)  # dtype mismatch
    assert not skinny_linear_supported(torch.zeros(0, k), w)


def _num_splits(cfg: SkinnyConfig, k: int) -> int:
    """Non-empty K splits of cfg (as the launcher computes them)."""
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    return triton.cdiv(k, k_per_split)


def test_compile_only_checks_args_and_writes_nothing(device):
    """skinny_linear_compile takes skinny_linear's arguments, raises its errors, computes nothing (a
    no-op in the interpreter; on a GPU it only compiles)."""
    x, w, b = _inputs(40, 48, 64, torch.float32, device)
    out = torch.full((40, 48), float("nan"), device=device)
    ws = SkinnyWorkspace.allocate(3 * 40 * 48, 8, device)
    assert skinny_linear_compile(x, w, b, out=out, config=DOT_SPLIT3, workspace=ws) is None
    assert torch.isnan(out).all() and int(ws.counters.abs().sum()) == 0
    with pytest.raises(ValueError, match="reduce path"):
        skinny_linear_compile(x, w, b, config=SkinnyConfig(16, 16))
    with pytest.raises(ValueError, match="workspace too small"):
        skinny_linear_compile(x, w, b, config=DOT_SPLIT3, workspace=SkinnyWorkspace.allocate(8, 1, device))


def test_linear_workspace_covers_routed_rows(monkeypatch):
    """models.Linear sizes its split-K scratch for every M skinny_linear may get for its shape:
    M <= 16 only without a TUNED entry, up to 128 rows with a (128, N, K) entry."""
    from radixrt.models import linear as linear_mod

    assert linear_mod.SKINNY_MAX_ROWS == gemv.MAX_M_DOT
    n, k = 96, 1024
    monkeypatch.setattr(gemv, "TUNED", {})
    small = linear_mod.Linear(k, n, bias=False)._scratch(torch.device("cpu"))
    assert small.partials.numel() == max(_num_splits(default_config(m, n, k), k) * m * n
                                         for m in range(1, 17))
    tuned = SkinnyConfig(32, 64, split_k=4, use_dot=True)
    monkeypatch.setattr(gemv, "TUNED", {(128, n, k): tuned})
    big = linear_mod.Linear(k, n, bias=False)._scratch(torch.device("cpu"))
    assert big.partials.numel() >= 4 * 128 * n and big.counters.numel() >= n // 32
    x = _randn(128, k, dtype=torch.float32, device="cpu", seed=13) / 8
    w = _randn(n, k, dtype=torch.float32, device="cpu", seed=14) / 8
    assert skinny_linear_supported(x, w)
    torch.testing.assert_close(skinny_linear(x, w, workspace=big), skinny_linear_ref(x, w), atol=1e-4,
                               rtol=1e-4)


# Qwen2.5-7B linears (N, K, bias): qkv, o_proj, gate_up (fused), down, lm_head
QWEN_7B = {"qkv": (4608, 3584, True), "o_proj": (3584, 3584, False), "gate_up": (37888, 3584, False),
           "down": (3584, 18944, False), "lm_head": (152064, 3584, False)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(QWEN_7B))
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("variant", ["default", "dot", "two-kernel"])
def test_skinny_linear_qwen_shapes_gpu(name, m, variant):
    n, k, with_bias = QWEN_7B[name]
    dev = torch.device("cuda")
    x, w, b = _inputs(m, n, k, torch.bfloat16, dev, with_bias)
    x, w = x / 8, w / 8  # magnitudes of a real layer's activations and weights
    cfg = default_config(m, n, k, torch.cuda.get_device_properties(dev).multi_processor_count)
    if variant == "dot":
        cfg = SkinnyConfig(64, 128, cfg.split_k, 4, 4, use_dot=True)
    elif variant == "two-kernel":
        cfg = SkinnyConfig(cfg.block_n, cfg.block_k, max(2, cfg.split_k), cfg.num_warps, cfg.num_stages,
                           cfg.use_dot, serial_reduce=False)
    ws = SkinnyWorkspace.allocate(cfg.split_k * m * n, n, dev)
    ref = skinny_linear_ref(x, w, b)
    first = None
    for _ in range(3):  # repeated calls on one workspace: counters reset, results bit-identical
        y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
        skinny_linear(x, w, b, out=y, config=cfg, workspace=ws)
        assert not torch.isnan(y).any()
        rel = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
        assert rel <= 1e-2, f"relative error {rel:.2e}"
        torch.testing.assert_close(y.float(), ref.float(), atol=2e-2, rtol=2e-2)
        first = y if first is None else first
        assert torch.equal(y, first), "split-K result is not deterministic"
    assert int(ws.counters.abs().sum()) == 0
    torch.testing.assert_close(y.float(), torch.nn.functional.linear(x, w, b).float(), atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name, m, serial", [(name, m, True) for name in ("qkv", "o_proj", "gate_up", "down")
                                             for m in (64, 256)] + [("qkv", 100, False)])
def test_skinny_linear_large_m_gpu(name, m, serial):
    """The dot path at M = 64..256 (BM up to 256) with the default configs (and the two-kernel
    split-K reduction at M = 100), compiled, in bf16 on the Qwen2.5-7B shapes."""
    n, k, with_bias = QWEN_7B[name]
    dev = torch.device("cuda")
    x, w, b = _inputs(m, n, k, torch.bfloat16, dev, with_bias)
    x, w = x / 8, w / 8
    cfg = default_config(m, n, k, torch.cuda.get_device_properties(dev).multi_processor_count)
    if not serial:
        cfg = SkinnyConfig(cfg.block_n, cfg.block_k, max(2, cfg.split_k), cfg.num_warps, cfg.num_stages, True,
                           serial_reduce=False)
    ws = SkinnyWorkspace.allocate(cfg.split_k * m * n, n, dev)
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
    skinny_linear(x, w, b, out=y, config=cfg, workspace=ws)
    ref = skinny_linear_ref(x, w, b)
    assert not torch.isnan(y).any()
    assert ((y.float() - ref.float()).norm() / ref.float().norm()).item() <= 1e-2
    torch.testing.assert_close(y.float(), ref.float(), atol=2e-2, rtol=2e-2)
    assert int(ws.counters.abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_skinny_linear_cuda_graph_gpu():
    """Captured with a shared workspace, replayed after x changes in place: the new product comes out."""
    dev = torch.device("cuda")
    x, w, b = _inputs(1, 4608, 3584, torch.bfloat16, dev)
    ws = SkinnyWorkspace.allocate(16 * 4608, 4608, dev)
    y = torch.empty(1, 4608, dtype=torch.bfloat16, device=dev)
    cfg = SkinnyConfig(16, 256, split_k=4)
    skinny_linear(x, w, b, out=y, config=cfg, workspace=ws)  # compile before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        skinny_linear(x, w, b, out=y, config=cfg, workspace=ws)
    x.copy_(_randn(1, 3584, dtype=torch.bfloat16, device=dev, seed=9))
    graph.replay()
    ref = skinny_linear_ref(x, w, b)
    assert ((y.float() - ref.float()).norm() / ref.float().norm()).item() <= 1e-2
