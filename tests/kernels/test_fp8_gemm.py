"""The FP8 x FP8 tensor-core GEMM (kernels/gemm_fp8.py: per-token x per-channel scales in the
epilogue, the swapped form for few rows, split-K summed by a tile's last program) and its routing.

CPU through the Triton interpreter (e4m3 operands, fp32 sums and fp32 / fp16 outputs: the interpreter's
bf16 arithmetic is never used). Outputs are poisoned with NaN first and compared with a float64
reference on the same e4m3 values and scales. Odd sizes throughout (rows and columns past the tile
edges, K not a multiple of the K step). The 7B shapes and graph capture are GPU tests (test_fp8_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import gemm_fp8 as G
from radixrt.kernels.gemv import SkinnyWorkspace
from radixrt.models.quant.fp8 import quantize_per_channel, quantize_per_token

from .conftest import DEVICE


def _operands(m: int, n: int, k: int, seed: int, bias: bool):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * 3.0
    w = torch.randn(n, k, generator=gen) * 0.05
    xq, xs = quantize_per_token(x)
    wq, ws = quantize_per_channel(w)
    b = torch.randn(n, generator=gen) if bias else None
    ref = (xq.double() * xs.double()) @ (wq.double() * ws.double()[:, None]).t()
    if b is not None:
        ref += b.double()
    def to(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(DEVICE)

    return to(xq), to(xs), to(wq), to(ws), to(b), ref


CASES = [
    # (m, n, k, config): plain tiles with ragged rows / columns and a partial last K step
    (70, 40, 96, G.Fp8GemmConfig(64, 32, 64, group_m=2)),
    # swapped (tokens on the narrow side), split-K 3 over K = 200 (splits of 128, 64 and nothing: the
    # empty third split is never launched), bias
    (5, 72, 200, G.Fp8GemmConfig(16, 64, 64, swap_ab=True, split_k=3)),
    # swapped, even split-K (no masks), 2 row blocks
    (33, 64, 128, G.Fp8GemmConfig(16, 64, 32, swap_ab=True, split_k=2)),
    # plain with split-K and several groups of row blocks
    (40, 24, 96, G.Fp8GemmConfig(16, 16, 32, group_m=1, split_k=2)),
]


@pytest.mark.parametrize("m, n, k, cfg", CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float64_reference(m: int, n: int, k: int, cfg: G.Fp8GemmConfig, bias: bool) -> None:
    xq, xs, wq, ws, b, ref = _operands(m, n, k, seed=m + n + k, bias=bias)
    y = torch.full((m, n), float("nan"), dtype=torch.float32, device=DEVICE)
    need_p, need_c = cfg.workspace_need(m, n, k)
    ws_buf = SkinnyWorkspace.allocate(max(need_p, 1), max(need_c, 1), DEVICE)
    for _ in range(2):  # the second call finds the split-K counters reset by the first
        G.fp8_gemm(xq, xs, wq, ws, b, out=y, config=cfg, workspace=ws_buf)
        err = (y.double().cpu() - ref).abs().max() / ref.abs().max()
        assert torch.isfinite(y).all() and float(err) < 1e-5, f"rel max err {float(err):.2e}"
    assert int(ws_buf.counters.abs().sum()) == 0


def test_fp16_output_and_default_config() -> None:
    """out_dtype fp16 through fp8_gemm_config's rule (swapped, split-K at this size)."""
    m, n, k = 3, 80, 256
    xq, xs, wq, ws, _, ref = _operands(m, n, k, seed=7, bias=False)
    cfg = G.fp8_gemm_config(m, n, k)
    assert cfg.swap_ab and cfg.block_m == 16
    y = G.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float16)
    assert y.dtype == torch.float16 and y.shape == (m, n)
    err = (y.double().cpu() - ref).abs().max() / ref.abs().max()
    assert float(err) < 2e-3


def test_rule_and_buckets() -> None:
    """The rule's shapes: 128 x 256 tiles above 1,024 rows, 64/128-row tiles in between, swapped and
    split to cover 132 SMs at decode sizes; buckets round up and clamp."""
    assert G.row_bucket(1) == 32 and G.row_bucket(33) == 64 and G.row_bucket(10**6) == G.FP8_GEMM_BUCKETS[-1]
    big = G.fp8_gemm_config(8192, 37888, 3584)
    assert (big.block_m, big.block_n, big.swap_ab) == (128, 256, False) or (8192, 37888, 3584) in [
        (b, n, k) for b, n, k in G.FP8_GEMM_TUNED]
    small = G.Fp8GemmConfig(16, 64, 128, swap_ab=True, split_k=4)
    assert small.splits(18944) == (4736, 4) and small.workspace_need(16, 3584, 18944) == (4 * 16 * 3584, 56)
    assert G.Fp8GemmConfig(64, 64).workspace_need(64, 3584, 3584) == (0, 0)


@pytest.mark.parametrize("bad", ["dtype", "k", "scale", "workspace"])
def test_bad_operands_raise(bad: str) -> None:
    xq, xs, wq, ws, _, _ = _operands(4, 16, 32, seed=1, bias=False)
    cfg = None
    if bad == "dtype":
        xq = xq.float()
    elif bad == "k":
        wq = wq[:, :16].contiguous()
    elif bad == "scale":
        ws = ws[:8]
    else:
        cfg = G.Fp8GemmConfig(16, 16, 16, swap_ab=False, split_k=2)
        with pytest.raises(ValueError, match="split-K"):
            G.fp8_gemm(xq, xs, wq, ws, config=cfg, workspace=SkinnyWorkspace.allocate(1, 1, DEVICE))
        return
    with pytest.raises(ValueError):
        G.fp8_gemm(xq, xs, wq, ws, config=cfg)
