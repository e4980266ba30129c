"""store_kv against its torch reference: strided inputs, odd sizes, padding tokens sent to the sink."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import store_kv
from radixrt.kernels.reference import store_kv_ref


@pytest.mark.parametrize("num_tokens, head_dim, dtype", [
    (1, 64, torch.float32), (7, 80, torch.float16), (33, 64, torch.float16),
])
def test_store_kv_matches_reference(paged_batch, num_tokens, head_dim, dtype):
    batch = paged_batch([5], [num_tokens], page_size=16, num_q_heads=4, num_kv_heads=2,
                        head_dim=head_dim, dtype=dtype)
    assert num_tokens == 1 or not batch.k.is_contiguous()  # views into a fused QKV tensor
    k_ref, v_ref = batch.k_buffer.clone(), batch.v_buffer.clone()
    store_kv(batch.k_buffer, batch.v_buffer, batch.out_cache_loc, batch.k, batch.v)
    store_kv_ref(k_ref, v_ref, batch.out_cache_loc, batch.k, batch.v)
    assert torch.equal(batch.k_buffer, k_ref) and torch.equal(batch.v_buffer, v_ref)
    assert torch.equal(batch.k_buffer[batch.out_cache_loc], batch.k)


def test_store_kv_casts_and_pads_to_sink(device):
    pool_k = torch.full((32, 2, 16), float("nan"), dtype=torch.float16, device=device)
    pool_v = pool_k.clone()
    k = torch.randn(4, 2, 16, device=device)
    v = torch.randn(4, 2, 16, device=device)
    loc = torch.tensor([17, 3, 0, 0], dtype=torch.int64, device=device)  # two padding tokens -> slot 0
    store_kv(pool_k, pool_v, loc, k, v)
    assert torch.equal(pool_k[17], k[0].half()) and torch.equal(pool_v[3], v[1].half())
    assert torch.isnan(pool_k[1:3]).all() and torch.isnan(pool_v[18:]).all()  # nothing else written


def test_store_kv_rejects_bad_shapes(device):
    pool = torch.zeros(8, 2, 16, device=device)
    with pytest.raises(ValueError):
        store_kv(pool, pool.clone(), torch.zeros(3, dtype=torch.int64, device=device),
                 torch.zeros(3, 4, 16, device=device), torch.zeros(3, 4, 16, device=device))
    with pytest.raises(ValueError):
        store_kv(pool, pool.clone(), torch.zeros(2, dtype=torch.int64, device=device),
                 torch.zeros(3, 2, 16, device=device), torch.zeros(3, 2, 16, device=device))
