"""The FP8 kernel variants that bench/kernels/sweep_fp8.py times on the GPU give the reference's answer
(interpreter, small shapes): decode attention over an FP8 pool with kv_dot "f16" (q, K, V and P in
fp16) and "q" (K/V widened to q's dtype), at several blocks and split counts, and the skinny GEMM's
fp16-dot form for FP8 weights (SkinnyConfig.f16_dot) at M = 1 (one x row loaded) and M > 1.

q is fp32 or fp16 here (the interpreter computes bf16 wrongly); with kv_dot "f16" an fp32 q is
rounded to fp16, so those cases use the fp16 tolerance.

The FP8-operand forms (kernels/paged_loop_fp8.py) round q and P to e4m3, so they are held to bounds
on ||out - ref|| / ||ref|| derived from the operand rounding: a single e4m3 term is within 2^-4
relative (~2.5% rms), which perturbs every probability by about that much, plus the score error
(q's rounding times the score spread); the split terms ("fp8x2": q and P each hi + lo / 8; "qk8":
q split, P in fp16) are within 2^-7 relative. Measured on these inputs (before "qk8" existed): fp8
1.8-4.1%, fp8x2 0.10-0.40% (the interpreter also mis-rounds some fp32 -> e4m3 conversions, which
only adds error)."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import attention_configs as ac
from radixrt.kernels import cascade_decode_attention, choose_num_kv_splits, decode_attention
from radixrt.kernels.gemv import SkinnyConfig, default_config, fp8_config, skinny_linear
from radixrt.kernels.reference import cascade_decode_attention_ref, decode_attention_ref, quantize_kv_ref
from radixrt.models.quant.fp8 import fp8_linear_ref, quantize_per_channel

from .conftest import DEVICE, make_paged_batch
from .test_cascade_attention import make_cascade_batch

K_SCALE, V_SCALE = 0.0625, 0.03125
F16_TOL = 2e-3  # fp16 q / P (10-bit mantissas) against the fp32 reference


pytestmark = pytest.mark.usefixtures("no_attention_overrides")


def _fp8_pools(b) -> tuple[torch.Tensor, torch.Tensor]:
    return (quantize_kv_ref(b.k_buffer * K_SCALE * 8.0, K_SCALE),
            quantize_kv_ref(b.v_buffer * V_SCALE * 8.0, V_SCALE))


@pytest.mark.parametrize("kv_dot, block_n, q_dtype, num_kv_splits", [
    ("f16", 16, torch.float32, 3), ("f16", 32, torch.float16, 1), ("q", 32, torch.float16, 2),
    ("f16v", 16, torch.float32, 3), ("f16v", 32, torch.float16, 1), ("f16v8", 16, torch.float32, 3),
    ("f16v8", 32, torch.float16, 1)])
def test_decode_fp8_variants_match_reference(monkeypatch, kv_dot, block_n, q_dtype, num_kv_splits):
    monkeypatch.setitem(ac.CPU, "decode_fp8", {"BLOCK_N": block_n, "num_warps": 4, "num_stages": 1,
                                               "kv_dot": kv_dot})
    b = make_paged_batch([1, 37, 70], [0, 0, 0], 16, 8, 2, 64, torch.float32, seed=block_n)
    kb, vb = _fp8_pools(b)
    q = torch.randn(3, 8, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE, q_dtype)
    if q_dtype == torch.float32:
        q[0, 0, 0] = 1e5  # past fp16's range: the f16 form clamps it to 65504 (as for a bf16 q)
    out = decode_attention(q, kb, vb, b.page_table, b.seq_lens, 16, None, num_kv_splits,
                           k_scale=K_SCALE, v_scale=V_SCALE)
    qr = q.float().clamp(-65504, 65504) if kv_dot in ("f16", "f16v", "f16v8") else q.float()
    ref = decode_attention_ref(qr, kb, vb, b.page_table, b.seq_lens, 16, None, k_scale=K_SCALE,
                               v_scale=V_SCALE)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=F16_TOL, rtol=F16_TOL)


@pytest.mark.parametrize("q_dtype, num_kv_splits", [(torch.float32, 3), (torch.float16, 1)])
def test_decode_fp8_warp_split_f16_matches_reference(monkeypatch, q_dtype, num_kv_splits):
    """The GPU's "long" form over an FP8 pool: kv_dot "f16" with each block's keys split across 2 warps
    (paged_attn_loop_ws), q clamped to fp16's range as the row-split form does."""
    monkeypatch.setitem(ac.CPU, "decode_fp8", {"BLOCK_N": 32, "num_warps": 2, "num_stages": 1,
                                               "kv_dot": "f16", "warp_split": True})
    b = make_paged_batch([1, 17, 37, 70], [0, 0, 0, 0], 16, 8, 2, 64, torch.float32, seed=5)
    kb, vb = _fp8_pools(b)
    q = torch.randn(4, 8, 64, generator=torch.Generator().manual_seed(3)).to(DEVICE, q_dtype)
    if q_dtype == torch.float32:
        q[1, 0, 0] = 1e5
    out = decode_attention(q, kb, vb, b.page_table, b.seq_lens, 16, None, num_kv_splits,
                           k_scale=K_SCALE, v_scale=V_SCALE)
    ref = decode_attention_ref(q.float().clamp(-65504, 65504), kb, vb, b.page_table, b.seq_lens, 16, None,
                               k_scale=K_SCALE, v_scale=V_SCALE)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=F16_TOL, rtol=F16_TOL)


# kv_dot -> bound on the relative norm error (module docstring): about 2x the measured worst case
FP8_FORM_TOL = {"fp8": 8e-2, "fp8x2": 1e-2, "qk8": 1e-2}


@pytest.mark.parametrize("kv_dot", sorted(FP8_FORM_TOL))
@pytest.mark.parametrize("block_n, num_kv_splits, q_mul", [(16, 3, 1.0), (32, 1, 4.0)])
def test_decode_fp8_operand_forms_match_reference(monkeypatch, kv_dot, block_n, num_kv_splits, q_mul):
    monkeypatch.setitem(ac.CPU, "decode_fp8", {"BLOCK_N": block_n, "num_warps": 4, "num_stages": 1,
                                               "kv_dot": kv_dot})
    b = make_paged_batch([1, 37, 70, 300], [0, 0, 0, 0], 16, 8, 2, 64, torch.float32, seed=block_n)
    kb, vb = _fp8_pools(b)
    q = torch.randn(4, 8, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE) * q_mul
    q[1, 3] = 0.0  # an all-zero row takes the scale 1.0, not 0 / 0
    out = decode_attention(q, kb, vb, b.page_table, b.seq_lens, 16, None, num_kv_splits,
                           k_scale=K_SCALE, v_scale=V_SCALE)
    ref = decode_attention_ref(q, kb, vb, b.page_table, b.seq_lens, 16, None, k_scale=K_SCALE,
                               v_scale=V_SCALE)
    assert torch.isfinite(out).all()
    assert ((out - ref).norm() / ref.norm()).item() < FP8_FORM_TOL[kv_dot]


def test_cascade_fused_over_fp8_pool_with_f16_dots(monkeypatch):
    """The fused cascade form (one suffix split merging the prefix partials) takes kv_dot too."""
    monkeypatch.setitem(ac.CPU, "decode_fp8", {**ac.CPU["decode_fp8"], "kv_dot": "f16"})
    c = make_cascade_batch([(24, [1, 9, 3])], [13], 8, 8, 2, 32, torch.float32, seed=5)
    kb, vb = _fp8_pools(c)
    args = (c.q, kb, vb, c.page_table, c.seq_lens, c.kv_start, c.group_members, c.group_starts,
            c.group_prefix_lens, 8, None)
    out = cascade_decode_attention(*args, 1, 2, c.max_group_size, k_scale=K_SCALE, v_scale=V_SCALE)
    ref = cascade_decode_attention_ref(*args, k_scale=K_SCALE, v_scale=V_SCALE)
    torch.testing.assert_close(out, ref, atol=F16_TOL, rtol=F16_TOL)


def test_fp8_split_rule_is_its_own_entry():
    fp8_default = choose_num_kv_splits(64, 4, 4096, kv_fp8=True)
    bf16_default = choose_num_kv_splits(64, 4, 4096, 132, head_dim=64)  # d64: the per-SM rule, 3
    rule = ac.attention_config("decode_splits_fp8", 128)  # the measured default: FP8 has its own entry
    ac.set_overrides({"decode_splits": {"d128": rule}})
    assert choose_num_kv_splits(64, 4, 4096) == fp8_default  # the same rule gives the same splits
    ac.set_overrides({"decode_splits_fp8": {"d128": {"policy": "per_sm", "programs_per_sm": 8}}})
    assert choose_num_kv_splits(64, 4, 4096, kv_fp8=True) == 5  # cdiv(8 * 132, 256)
    assert choose_num_kv_splits(64, 4, 4096, 132, head_dim=64) == bf16_default == 3  # bf16 unchanged
    with pytest.raises(ValueError, match="kv_dot"):
        ac.set_overrides({"decode_fp8": {"d128": {"kv_dot": "bf16"}}})


@pytest.mark.parametrize("m, cfg", [
    (1, SkinnyConfig(16, 64, 1, 4, 2, use_dot=True, f16_dot=True)),  # one x row, broadcast
    (1, SkinnyConfig(32, 32, 2, 4, 2, use_dot=True, f16_dot=True)),  # split-K
    (5, SkinnyConfig(16, 32, 1, 4, 2, use_dot=True, f16_dot=True)),
    (4, None),  # the default (fp8_config: f16_dot from 3 rows on, shapes not in FP8_TUNED)
])
def test_skinny_fp8_f16_dot_matches_reference(m: int, cfg: SkinnyConfig | None) -> None:
    gen = torch.Generator().manual_seed(7 + m)
    w = torch.randn(80, 160, generator=gen) * torch.rand(80, 1, generator=gen)
    wq, ws = quantize_per_channel(w.to(DEVICE))
    x = torch.randn(m, 160, generator=gen).to(DEVICE)
    bias = torch.randn(80, generator=gen).to(DEVICE)
    out = skinny_linear(x, wq, bias, config=cfg, weight_scale=ws)
    ref = fp8_linear_ref(x, wq, ws, bias, quantize_input=False)
    torch.testing.assert_close(out, ref, atol=F16_TOL * 4, rtol=F16_TOL)
    x16 = x.half().float()  # the f16 dot rounds x to fp16: closer to that reference
    assert (out - fp8_linear_ref(x16, wq, ws, bias, quantize_input=False)).abs().max() < 1e-3


def test_fp8_config_takes_the_f16_dot_without_more_splits_or_row_blocks():
    for m, n, k in [(3, 4608, 3584), (4, 3584, 18944), (8, 37888, 3584), (8, 3584, 3584)]:
        bf16 = default_config(m, n, k)
        new = fp8_config(bf16, m)  # without (n, k): never an FP8_TUNED entry
        assert new.use_dot and new.f16_dot
        assert new.split_k <= bf16.split_k and new.block_n >= bf16.block_n
    with pytest.raises(ValueError, match="f16_dot needs use_dot"):
        SkinnyConfig(16, 64, f16_dot=True)


def test_fp8_default_at_one_or_two_rows_is_the_legacy_config() -> None:
    """Measured on the H200 (2026-12-01): the f16_dot rule ran M = 1 / 2 at 1.18x / 1.60x bf16's
    time; untuned shapes at M <= 2 keep the legacy config, tuned ones take FP8_TUNED."""
    from radixrt.kernels.gemv import FP8_TUNED, fp8_config_legacy

    for m in (1, 2):
        cfg = default_config(m, 80, 160, 132)
        assert fp8_config(cfg, m, 80, 160) == fp8_config_legacy(cfg, m)
        assert not fp8_config(cfg, m, 80, 160).f16_dot
    assert fp8_config(default_config(4, 80, 160, 132), 4, 80, 160).f16_dot
    tuned = FP8_TUNED[(1, 4608, 3584)]
    assert fp8_config(default_config(1, 4608, 3584, 132), 1, 4608, 3584) is tuned
