"""The native CPU rotary embedding, SiLU-and-mul and K/V store (kernels/cpu_native_ops.h through
radixrt.worker.cpu_native), and the attention kernel reading q in place and writing o (the CPU
backend's fast path when every row of a pass goes through it), against the torch formulas.
Skipped where the library does not build."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from radixrt.models import ops
from radixrt.models.rope import build_cos_sin_cache
from radixrt.worker import cpu_native

pytestmark = pytest.mark.skipif(cpu_native.load() is None, reason="native CPU kernels need a C compiler")


def _rotate_half_reference(x: torch.Tensor, pos: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """HF Llama's apply_rotary_pos_emb on x [T, H, D] in float64."""
    half = x.shape[-1] // 2
    cs = cache.double()[pos]
    cos = torch.cat([cs[:, :half], cs[:, :half]], -1).unsqueeze(1)
    sin = torch.cat([cs[:, half:], cs[:, half:]], -1).unsqueeze(1)
    xd = x.double()
    rot = torch.cat([-xd[..., half:], xd[..., :half]], -1)
    return xd * cos + rot * sin


@pytest.mark.parametrize("t,hq,hkv,d", [(1, 9, 3, 64), (32, 9, 3, 64), (7, 4, 4, 128), (3, 2, 1, 16)])
def test_rotary_in_place_on_fused_qkv_matches_hf(t: int, hq: int, hkv: int, d: int) -> None:
    g = torch.Generator().manual_seed(t * 100 + d)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g) * 4
    before = qkv.clone()
    cache = build_cos_sin_cache(d, 4096, 10000.0, None, "cpu")
    pos = torch.randint(0, 4096, (t,), generator=g)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)
    qr, kr = ops.apply_rotary(q, k, pos, cache)
    assert qr.data_ptr() == q.data_ptr() and kr.data_ptr() == k.data_ptr()  # in place: the native path
    ref_q = _rotate_half_reference(before[:, :hq * d].view(t, hq, d), pos, cache)
    ref_k = _rotate_half_reference(before[:, hq * d:(hq + hkv) * d].view(t, hkv, d), pos, cache)
    torch.testing.assert_close(qr.double(), ref_q, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(kr.double(), ref_k, rtol=1e-6, atol=1e-5)
    assert torch.equal(qkv[:, (hq + hkv) * d:], before[:, (hq + hkv) * d:])  # v untouched


def test_rotary_at_position_zero_is_the_identity() -> None:
    qkv = torch.randn(2, 3 * 64)
    before = qkv.clone()
    cache = build_cos_sin_cache(64, 16, 10000.0, None, "cpu")
    q, k = qkv[:, :128].view(2, 2, 64), qkv[:, 128:].view(2, 1, 64)
    qr, kr = ops.apply_rotary(q, k, torch.zeros(2, dtype=torch.int64), cache)
    assert qr.data_ptr() == q.data_ptr()  # the native path
    assert torch.equal(qr, before[:, :128].view(2, 2, 64)) and torch.equal(kr, before[:, 128:].view(2, 1, 64))


@pytest.mark.parametrize("t,n", [(1, 1536), (32, 1536), (5, 40), (2, 17)])
def test_silu_and_mul_matches_torch_over_a_wide_range(t: int, n: int) -> None:
    g = torch.Generator().manual_seed(t + n)
    x = torch.randn(t, 2 * n, generator=g) * 30  # exp's argument far past +-88 in places
    x[0, 0], x[0, 1] = 1000.0, -1000.0
    y = cpu_native.silu_and_mul(x)
    ref = F.silu(x[:, :n].double()) * x[:, n:].double()
    assert y.shape == (t, n) and torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), ref, rtol=2e-6, atol=1e-6)


def test_store_kv_writes_the_slots_and_nothing_else() -> None:
    hkv, d, t = 3, 64, 5
    k_buf, v_buf = torch.zeros(40, hkv, d), torch.zeros(40, hkv, d)
    qkv = torch.randn(t, (9 + 2 * hkv) * d)
    k = qkv[:, 9 * d:(9 + hkv) * d].view(t, hkv, d)
    v = qkv[:, (9 + hkv) * d:].view(t, hkv, d)
    slots = torch.tensor([7, 3, 39, 0, 21])
    assert cpu_native.store_kv(k_buf, v_buf, k, v, slots)
    assert torch.equal(k_buf[slots], k) and torch.equal(v_buf[slots], v)
    others = torch.ones(40, dtype=torch.bool)
    others[slots] = False
    assert not k_buf[others].any() and not v_buf[others].any()


def test_store_kv_declines_what_it_does_not_take() -> None:
    k_buf = torch.zeros(8, 2, 16, dtype=torch.bfloat16)
    k = torch.randn(2, 2, 16)
    assert not cpu_native.store_kv(k_buf, k_buf.clone(), k, k.clone(), torch.tensor([1, 2]))
    assert not k_buf.any()
    f_buf = torch.zeros(8, 2, 16)
    int32_slots = torch.tensor([1, 2], dtype=torch.int32)
    assert not cpu_native.store_kv(f_buf, f_buf.clone(), k, k.clone(), int32_slots)


def test_attention_reading_q_in_place_equals_the_gathered_path() -> None:
    """A plan over every row of q (a decode and a 4-token extend over a cached prefix): q given as the
    strided q columns of a fused QKV output and `out` given, against q gathered contiguous."""
    hq, hkv, d = 6, 2, 64
    g = torch.Generator().manual_seed(3)
    k_buf, v_buf = torch.randn(64, hkv, d, generator=g), torch.randn(64, hkv, d, generator=g)
    qkv = torch.randn(5, (hq + 2 * hkv) * d, generator=g)
    q = qkv[:, :hq * d].view(5, hq, d)
    items = [(np.arange(10, 30), [0]),  # row 0: a decode over 20 slots
             (np.arange(30, 40), [1, 2, 3, 4]),  # rows 1-4: an extend's cached prefix
             (np.arange(40, 44), [1, 2, 3, 4], True)]  # and its own new tokens, causal
    plan = cpu_native.DecodePlan.build([0, 1, 2, 3, 4], items)
    assert plan.all_rows
    out = torch.empty(5, hq, d)
    got = cpu_native.decode_attention(q, k_buf, v_buf, plan, 0.125, out=out)
    assert got is out
    plan2 = cpu_native.DecodePlan.build([0, 1, 2, 3, 4], items)
    ref = cpu_native.decode_attention(q.contiguous(), k_buf, v_buf, plan2, 0.125)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    # and against plain softmax attention for the causal extend row 3 (prefix + new tokens 0..2)
    keys = torch.cat([torch.arange(30, 40), torch.arange(40, 43)])
    for h in range(hq):
        kk, vv = k_buf[keys, h // 3], v_buf[keys, h // 3]
        p = torch.softmax((q[3, h] @ kk.t()) * 0.125, -1)
        torch.testing.assert_close(out[3, h], p @ vv, rtol=1e-5, atol=1e-5)
