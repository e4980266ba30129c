"""A head-major pool ([Hkv, S, D] storage viewed as [S, Hkv, D]: one head's page is contiguous) gives
every paged kernel the same answer as the token-major pool holding the same values: store_kv writes
the same slots, decode (bf16-class and FP8 pools, one and several splits), extend over a cached
prefix, and cascade decode read the same keys. The kernels take the pool's strides; these tests fail
if any of them assumes the token-major strides (stride_h == D, stride_s == Hkv * D)."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import cascade_decode_attention, decode_attention, extend_attention, store_kv

from .conftest import DEVICE, make_paged_batch
from .test_cascade_attention import make_cascade_batch

FP8 = torch.float8_e4m3fn


def head_major(buf: torch.Tensor) -> torch.Tensor:
    """buf's values in [Hkv, S, D] storage, viewed as [S, Hkv, D]."""
    out = buf.permute(1, 0, 2).contiguous().permute(1, 0, 2)
    assert out.stride(1) == buf.shape[0] * buf.shape[2] and out.stride(0) == buf.shape[2]
    return out


def test_store_kv_writes_the_same_slots_into_a_head_major_pool():
    b = make_paged_batch([5, 0], [7, 20], 16, 4, 2, 64, torch.float32, seed=1)
    hk, hv = head_major(b.k_buffer), head_major(b.v_buffer)
    store_kv(b.k_buffer, b.v_buffer, b.out_cache_loc, b.k, b.v)
    store_kv(hk, hv, b.out_cache_loc, b.k, b.v)
    assert torch.equal(hk, b.k_buffer) and torch.equal(hv, b.v_buffer)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("fp8", [False, True], ids=["fp32-pool", "fp8-pool"])
def test_decode_attention_head_major_equals_token_major(splits, fp8):
    b = make_paged_batch([40, 3, 77], [1, 1, 1], 16, 8, 2, 64, torch.float32, seed=splits)
    kb, vb = b.k_buffer, b.v_buffer
    scales = {}
    if fp8:
        kb, vb = kb.to(FP8), vb.to(FP8)
        scales = {"k_scale": 0.5, "v_scale": 2.0}
    q = b.q[:, :, :].contiguous()
    args = (b.page_table, b.seq_lens, 16, None, splits)
    token = decode_attention(q, kb, vb, *args, **scales)
    head = decode_attention(q, head_major(kb), head_major(vb), *args, **scales)
    assert not torch.isnan(head).any()
    torch.testing.assert_close(head, token, atol=1e-6, rtol=1e-6)


def test_extend_attention_over_a_head_major_prefix_equals_token_major():
    b = make_paged_batch([37, 0, 16], [5, 20, 1], 16, 8, 2, 64, torch.float32, seed=3)
    args = (b.page_table, b.prefix_lens, b.extend_lens, b.extend_start_loc, 16, None, b.max_extend_len)
    token = extend_attention(b.q, b.k, b.v, b.k_buffer, b.v_buffer, *args)
    head = extend_attention(b.q, b.k, b.v, head_major(b.k_buffer), head_major(b.v_buffer), *args)
    torch.testing.assert_close(head, token, atol=1e-6, rtol=1e-6)


def test_cascade_decode_over_a_head_major_pool_equals_token_major():
    c = make_cascade_batch([(32, [1, 5, 20]), (16, [3])], [40], 16, 8, 2, 64, torch.float32, seed=2)
    token = cascade_decode_attention(*c.args(16), 1, 2, c.max_group_size)
    c.k_buffer, c.v_buffer = head_major(c.k_buffer), head_major(c.v_buffer)
    head = cascade_decode_attention(*c.args(16), 1, 2, c.max_group_size)
    assert token.device == DEVICE
    torch.testing.assert_close(head, token, atol=1e-6, rtol=1e-6)
