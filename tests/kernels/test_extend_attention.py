"""extend_attention against the torch reference: page sizes 1/16/64, GQA 1/4/7, head dims 64/80,
prefixes ending inside a page, mixed lengths in one batch, poisoned outputs."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import extend_attention
from radixrt.kernels.reference import extend_attention_ref

TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3)}

CASES = [
    # prefix_lens, extend_lens, page_size, Hq, Hkv, D, dtype
    pytest.param([0], [7], 1, 2, 2, 64, torch.float32, id="prefill-page1-mha"),
    pytest.param([5, 0, 16, 37], [33, 1, 7, 20], 16, 8, 2, 80, torch.float16, id="mixed-page16-gqa4-d80"),
    pytest.param([70, 3, 0], [33, 2, 1], 64, 7, 1, 64, torch.float32, id="page64-gqa7"),
    pytest.param([0, 0], [33, 17], 16, 4, 4, 64, torch.float16, id="prefill-page16-mha"),
    pytest.param([12, 0], [0, 9], 16, 4, 1, 64, torch.float32, id="empty-extend-gqa4"),
    # decoding rows of a mixed pass (one new token over a long prefix): GQA heads packed into rows
    pytest.param([40, 100, 0, 19], [1, 1, 30, 1], 16, 14, 2, 64, torch.float32, id="mixed-decode-rows-gqa7"),
    # a group larger than the CPU block of 16 rows: no packing, one program per query head
    pytest.param([33, 5], [1, 20], 16, 32, 1, 32, torch.float32, id="mixed-decode-rows-gqa32-unpacked"),
]


@pytest.mark.parametrize("prefix_lens, extend_lens, page_size, hq, hkv, head_dim, dtype", CASES)
def test_extend_attention_matches_reference(paged_batch, close, prefix_lens, extend_lens, page_size,
                                            hq, hkv, head_dim, dtype):
    b = paged_batch(prefix_lens, extend_lens, page_size, hq, hkv, head_dim, dtype, seed=len(prefix_lens))
    out = torch.full_like(b.q, float("nan"), memory_format=torch.contiguous_format)
    o = extend_attention(b.q, b.k, b.v, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens, b.extend_lens,
                         b.extend_start_loc, page_size, None, b.max_extend_len, out=out)
    ref = extend_attention_ref(b.q, b.k, b.v, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens,
                               b.extend_lens, b.extend_start_loc, page_size, None)
    assert o is out
    close(o, ref, *TOL[dtype])


def test_extend_attention_reads_prefix_through_page_table(paged_batch):
    """Scrambling the pool outside the prefix's slots must not change the output; scrambling one
    prefix slot must."""
    b = paged_batch([21], [5], 16, 4, 2, 64, torch.float32, seed=3)
    args = (b.page_table, b.prefix_lens, b.extend_lens, b.extend_start_loc, 16, 0.2, b.max_extend_len)
    o1 = extend_attention(b.q, b.k, b.v, b.k_buffer, b.v_buffer, *args)
    used = b.page_table[0, :2].long()
    keep = torch.zeros(b.k_buffer.shape[0], dtype=torch.bool, device=b.k_buffer.device)
    for p in used.tolist():
        keep[p * 16:(p + 1) * 16] = True
    keep[used[1] * 16 + 5:] &= False  # slots past the prefix end (21 = 16 + 5) are unused too
    k2, v2 = b.k_buffer.clone(), b.v_buffer.clone()
    k2[~keep] = 1e4
    v2[~keep] = -1e4
    o2 = extend_attention(b.q, b.k, b.v, k2, v2, *args)
    assert torch.equal(o1, o2)
    k2[used[1] * 16 + 4] += 1.0  # last prefix token (position 20)
    o3 = extend_attention(b.q, b.k, b.v, k2, v2, *args)
    assert not torch.equal(o1, o3)


def test_extend_attention_rejects_bad_gqa(paged_batch):
    b = paged_batch([0], [3], 16, 4, 4, 64, torch.float32)
    with pytest.raises(ValueError):
        extend_attention(b.q[:, :3], b.k, b.v, b.k_buffer, b.v_buffer, b.page_table, b.prefix_lens,
                         b.extend_lens, b.extend_start_loc, 16, None, 3)
