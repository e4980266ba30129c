"""bench/lab/fused_mlp_m1.py: the lab's one-token FP8 MLP kernel, run phase by phase (the Triton
interpreter runs programs one after another, so the grid barrier is for the GPU alone)."""

from __future__ import annotations

import pytest
import torch

from bench.lab.fused_mlp_m1 import MlpFp8M1, MlpFp8M1Config
from radixrt.models.quant.fp8 import quantize_per_channel


def reference(x, qgu, sgu, qdn, sdn):
    """fp32 product of the dequantized weights; act rounded to bf16 as the kernel stores it."""
    inter = qgu.shape[0] // 2
    gu = x.float() @ (qgu.float() * sgu[:, None]).T
    act = (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]).bfloat16().float()
    return act @ (qdn.float() * sdn[:, None]).T


@pytest.mark.parametrize(("h", "inter", "cfg", "programs"), [
    (64, 96, MlpFp8M1Config(4, 8, 2, 16), None),  # one tile / row block per program
    (64, 136, MlpFp8M1Config(4, 8, 4, 8, pipe=True), (7, 11)),  # stream-K shares across row blocks
    (128, 200, MlpFp8M1Config(8, 16, 4, 32, pipe=True), (3, 5)),  # partial last chunks (K % block)
])
def test_phases_match_the_reference_and_leave_the_scratch_zero(h, inter, cfg, programs) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, h).bfloat16()
    qgu, sgu = quantize_per_channel(torch.randn(2 * inter, h) * 0.05)
    qdn, sdn = quantize_per_channel(torch.randn(h, inter) * 0.05)
    mlp = MlpFp8M1(cfg)
    y = mlp(x, qgu, sgu, qdn, sdn, phase_programs=programs)
    ref = reference(x, qgu, sgu, qdn, sdn)
    assert y.shape == (1, h) and y.dtype == torch.bfloat16
    assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2
    _, _, y32, done = next(iter(mlp._scratch.values()))
    assert not y32.any() and not done.any()  # the next launch starts from zero sums and counters
    assert torch.equal(mlp(x, qgu, sgu, qdn, sdn, phase_programs=programs), y)


def test_refuses_what_it_does_not_take() -> None:
    qgu, sgu = quantize_per_channel(torch.randn(16, 8))
    qdn, sdn = quantize_per_channel(torch.randn(8, 8))
    with pytest.raises(ValueError):
        MlpFp8M1()(torch.randn(2, 8).bfloat16(), qgu, sgu, qdn, sdn)  # two rows
    with pytest.raises(ValueError):
        MlpFp8M1Config(block_n1=3)
