"""skinny_linear (decode GEMV) against the fp32 torch reference: both inner products (reduce, dot),
split-K with the serial fix-up and with the second reduction kernel, bias, ragged N and K, leading
dims, a reused workspace, argument errors; and the Qwen2.5-7B linears in bf16 on a GPU.

Tolerances (fp32 accumulation, reference in fp32 from the same inputs): CPU fp32 atol = rtol = 1e-4
(sums of up to 160 products of N(0, 1) values, ~13 in magnitude, differ only in summation order);
fp16 atol = rtol = 2e-3 (about one fp16 ulp of the output); GPU bf16 ||y - ref|| / ||ref|| <= 1e-2
and |y - ref| <= 2e-2 + 2e-2 |ref|.
"""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import SkinnyConfig, SkinnyWorkspace, skinny_linear, skinny_linear_supported
from radixrt.kernels.gemv import default_config
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
    (lambda: (torch.zeros(17, 64), torch.zeros(48, 64), None, None), "at most 16"),
    (lambda: (torch.zeros(1, 32), torch.zeros(48, 64), None, None), "K ="),
    (lambda: (torch.zeros(1, 64), torch.zeros(48, 64, dtype=torch.float16), None, None), "equal"),
    (lambda: (torch.zeros(1, 64, dtype=torch.int32), torch.zeros(48, 64, dtype=torch.int32), None, None), "float"),
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
        skinny_linear(x, w, config=SkinnyConfig(16, 16, split_k=2), workspace=SkinnyWorkspace.allocate(8, 1, "cpu"))


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
