"""FP8 (float8_e4m3fn) KV pools with per-layer scales: store_kv, decode, extend and cascade attention
against the torch references, which dequantize the same FP8 bytes; the FP8 skinny GEMM (W8A16).

Runs on the CPU through the Triton interpreter, which loads FP8 correctly (checked here: the
kernels' results match the references to fp32 rounding). Its fp32 -> FP8 conversion, though,
mis-rounds values that round up into the next binade (31.7 -> 16 instead of 32; Triton 3.6), so
the CPU store_kv test stores values that are already FP8 numbers times the scale, which checks the
scaling, saturation and slots exactly; random values (rounding) are checked on the GPU
(test_fp8_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import cascade_decode_attention, decode_attention, extend_attention, store_kv
from radixrt.kernels.gemv import default_config, fp8_config_legacy, skinny_linear
from radixrt.kernels.reference import (
    cascade_decode_attention_ref,
    decode_attention_ref,
    extend_attention_ref,
    quantize_kv_ref,
    store_kv_ref,
)
from radixrt.models.quant.fp8 import fp8_linear_ref, quantize_per_channel

from .conftest import DEVICE, make_paged_batch
from .test_cascade_attention import make_cascade_batch

FP8 = torch.float8_e4m3fn
# (k_scale, v_scale): identity, and values far beyond +-448 (powers of two, so that x * (1 / scale)
# is exact and the interpreter's rounding never matters in the store test)
SCALES = [(1.0, 1.0), (0.0625, 0.03125)]


def _fp8_pool(buf: torch.Tensor, scale: float) -> torch.Tensor:
    """The float pool `buf` as an FP8 pool holding buf / scale (what store_kv would write)."""
    return quantize_kv_ref(buf * scale * 8.0, scale)  # x8: a spread that uses the e4m3 range


@pytest.mark.parametrize("k_scale, v_scale", SCALES)
def test_store_kv_fp8_scales_saturates_and_hits_the_slots(k_scale: float, v_scale: float) -> None:
    b = make_paged_batch([3, 0], [5, 9], 4, 4, 2, 32, torch.float32)
    gen = torch.Generator().manual_seed(3)
    # exactly representable after scaling: FP8 numbers (as floats) times the scale
    k = torch.randn(b.k.shape, generator=gen).mul(60).to(FP8).float().to(DEVICE) * k_scale
    v = torch.randn(b.v.shape, generator=gen).mul(60).to(FP8).float().to(DEVICE) * v_scale
    k[0, 0, :4] = torch.tensor([1e6, -1e6, 448.0 * k_scale, 0.0])  # saturate to +-448; edges exact
    kb, vb = b.k_buffer.to(FP8), b.v_buffer.to(FP8)
    kr, vr = kb.clone(), vb.clone()
    store_kv(kb, vb, b.out_cache_loc, k, v, k_scale=k_scale, v_scale=v_scale)
    store_kv_ref(kr, vr, b.out_cache_loc, k, v, k_scale, v_scale)
    assert torch.equal(kb.view(torch.uint8), kr.view(torch.uint8))
    assert torch.equal(vb.view(torch.uint8), vr.view(torch.uint8))
    row = kb[b.out_cache_loc[0], 0, :4].float()
    assert row.tolist() == [448.0, -448.0, 448.0, 0.0]


@pytest.mark.parametrize("k_scale, v_scale", SCALES)
@pytest.mark.parametrize("seq_lens, page_size, num_kv_splits", [([1, 37, 130], 16, 3), ([64, 5], 1, 1)])
def test_decode_attention_fp8_pool_matches_reference(seq_lens, page_size, num_kv_splits, k_scale, v_scale):
    b = make_paged_batch(seq_lens, [0] * len(seq_lens), page_size, 8, 2, 64, torch.float32, seed=1)
    kb, vb = _fp8_pool(b.k_buffer, k_scale), _fp8_pool(b.v_buffer, v_scale)
    q = torch.randn(len(seq_lens), 8, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    out = decode_attention(q, kb, vb, b.page_table, b.seq_lens, page_size, None, num_kv_splits,
                           k_scale=k_scale, v_scale=v_scale)
    ref = decode_attention_ref(q, kb, vb, b.page_table, b.seq_lens, page_size, None,
                               k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    if k_scale != 1.0:  # the scales matter: ignoring them gives a different answer
        wrong = decode_attention_ref(q, kb, vb, b.page_table, b.seq_lens, page_size, None)
        assert not torch.allclose(out, wrong, atol=1e-2)


@pytest.mark.parametrize("k_scale, v_scale", SCALES)
def test_extend_attention_fp8_prefix_matches_reference(k_scale: float, v_scale: float) -> None:
    b = make_paged_batch([0, 21, 40], [7, 18, 1], 4, 8, 2, 32, torch.float32, seed=4)
    kb, vb = _fp8_pool(b.k_buffer, k_scale), _fp8_pool(b.v_buffer, v_scale)
    out = extend_attention(b.q, b.k, b.v, kb, vb, b.page_table, b.prefix_lens, b.extend_lens,
                           b.extend_start_loc, 4, None, b.max_extend_len, k_scale=k_scale, v_scale=v_scale)
    ref = extend_attention_ref(b.q, b.k, b.v, kb, vb, b.page_table, b.prefix_lens, b.extend_lens,
                               b.extend_start_loc, 4, None, k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_kv_splits", [1, 2])
def test_cascade_attention_fp8_pool_matches_reference(num_kv_splits: int) -> None:
    k_scale, v_scale = 0.05, 0.02  # (no store here: any scale)
    c = make_cascade_batch([(24, [1, 9, 3])], [13], 8, 8, 2, 32, torch.float32, seed=5)
    kb, vb = _fp8_pool(c.k_buffer, k_scale), _fp8_pool(c.v_buffer, v_scale)
    args = (c.q, kb, vb, c.page_table, c.seq_lens, c.kv_start, c.group_members, c.group_starts,
            c.group_prefix_lens, 8, None)
    out = cascade_decode_attention(*args, num_kv_splits, 2, c.max_group_size, k_scale=k_scale,
                                   v_scale=v_scale)
    ref = cascade_decode_attention_ref(*args, k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("m, with_bias", [(1, False), (3, True), (16, False)])
def test_skinny_linear_fp8_weight_matches_dequantized_reference(m: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(6)
    w = torch.randn(96, 160, generator=gen) * torch.rand(96, 1, generator=gen)
    w[5] = 0.0  # a zero row (scale 1.0)
    wq, ws = quantize_per_channel(w.to(DEVICE))
    x = torch.randn(m, 160, generator=gen).to(DEVICE)
    bias = torch.randn(96, generator=gen).to(DEVICE) if with_bias else None
    # the widen-to-x's-dtype form (fp32 here: exact); the default f16-dot form rounds x to fp16 and
    # is checked in test_fp8_variants.py
    cfg = fp8_config_legacy(default_config(m, 96, 160), m)
    out = skinny_linear(x, wq, bias, config=cfg, weight_scale=ws)
    ref = fp8_linear_ref(x, wq, ws, bias, quantize_input=False)  # W8A16: x is not quantized
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="weight_scale"):
        skinny_linear(x, wq, bias)
