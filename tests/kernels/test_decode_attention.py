"""decode_attention (split-KV, GQA-grouped) against the torch reference: page sizes 1/16/64, GQA
1/4/7, head dims 64/80, splits that end up empty, zero-length rows, poisoned outputs."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels import choose_num_kv_splits, decode_attention
from radixrt.kernels.reference import decode_attention_ref, slots_of

TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3)}

CASES = [
    # seq_lens, page_size, Hq, Hkv, D, dtype, num_kv_splits
    pytest.param([1, 7, 33], 1, 2, 2, 64, torch.float32, 1, id="page1-mha-1split"),
    pytest.param([1, 5, 16, 33, 100], 16, 7, 1, 80, torch.float16, 4, id="page16-gqa7-d80-4splits"),
    pytest.param([70, 129], 64, 8, 2, 64, torch.float32, 3, id="page64-gqa4-3splits"),
    pytest.param([37, 2], 16, 4, 1, 64, torch.float16, 8, id="page16-gqa4-8splits-mostly-empty"),
    # one split writes the output directly (no merge stage)
    pytest.param([1, 5, 16, 100], 16, 7, 1, 80, torch.float16, 1, id="page16-gqa7-d80-1split"),
]


@pytest.mark.parametrize("seq_lens, page_size, hq, hkv, head_dim, dtype, num_kv_splits", CASES)
def test_decode_attention_matches_reference(paged_batch, close, seq_lens, page_size, hq, hkv, head_dim,
                                            dtype, num_kv_splits):
    b = paged_batch([s - 1 for s in seq_lens], [1] * len(seq_lens), page_size, hq, hkv, head_dim, dtype,
                    seed=num_kv_splits)
    # the new token's K/V is in the pool before decode runs
    b.k_buffer[b.out_cache_loc] = b.k
    b.v_buffer[b.out_cache_loc] = b.v
    out = torch.full_like(b.q, float("nan"), memory_format=torch.contiguous_format)
    mid_o = torch.full((len(seq_lens), hq, num_kv_splits, head_dim), float("nan"), device=b.q.device)
    mid_lse = torch.full((len(seq_lens), hq, num_kv_splits), float("nan"), device=b.q.device)
    o = decode_attention(b.q, b.k_buffer, b.v_buffer, b.page_table, b.seq_lens, page_size, None,
                         num_kv_splits, out=out, mid_o=mid_o, mid_lse=mid_lse)
    ref = decode_attention_ref(b.q, b.k_buffer, b.v_buffer, b.page_table, b.seq_lens, page_size, None)
    assert o is out
    close(o, ref, *TOL[dtype])


def test_decode_attention_split_count_does_not_change_result(paged_batch):
    b = paged_batch([150, 20], [1, 1], 16, 4, 2, 64, torch.float32, seed=7)
    b.k_buffer[b.out_cache_loc] = b.k
    b.v_buffer[b.out_cache_loc] = b.v
    args = (b.q, b.k_buffer, b.v_buffer, b.page_table, b.seq_lens, 16, 0.1)
    o1 = decode_attention(*args, 1)
    o5 = decode_attention(*args, 5)
    torch.testing.assert_close(o1, o5, atol=1e-5, rtol=1e-5)


def test_decode_attention_zero_length_row_is_zero(paged_batch):
    b = paged_batch([9, 0], [1, 1], 16, 4, 4, 64, torch.float32)
    seq_lens = b.seq_lens.clone()
    seq_lens[1] = 0  # e.g. a padded CUDA-graph row
    o = decode_attention(b.q, b.k_buffer, b.v_buffer, b.page_table, seq_lens, 16, None, 2)
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    assert not torch.isnan(o).any()


def test_choose_num_kv_splits():
    assert choose_num_kv_splits(1, 4, 100) == 1  # short sequence: no split
    assert choose_num_kv_splits(1, 4, 32768) == 64  # one long sequence: capped
    assert choose_num_kv_splits(1, 4, 32768, max_splits=32) == 32
    assert choose_num_kv_splits(256, 4, 32768) == 1  # big batch fills the GPU alone
    # the d128 default ("waves", occupancy 2): 256 (request, KV head) pairs fill one wave unsplit
    assert choose_num_kv_splits(64, 4, 4096) == 1 and choose_num_kv_splits(32, 4, 4096) == 2
    for b in (1, 3, 64, 256):
        for n in (1, 128, 5000):
            assert 1 <= choose_num_kv_splits(b, 4, n) <= 64


def _poison_unread_slots(buf: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor,
                         page_size: int) -> torch.Tensor:
    """buf with NaN (0x7F bytes in an FP8 pool) in every slot that no request's positions cover,
    e.g. the rest of a request's last page, as a reused page holds stale values there."""
    keep = torch.zeros(buf.shape[0], dtype=torch.bool, device=buf.device)
    for b, n in enumerate(seq_lens.tolist()):
        keep[slots_of(page_table[b], page_size, 0, n)] = True
    out = buf.clone()
    if out.dtype == torch.float8_e4m3fn:
        out.view(torch.uint8)[~keep] = 0x7F
    else:
        out[~keep] = float("nan")
    return out


def _poisoned_decode_case(paged_batch, seq_lens: list[int], pool: str, head_dim: int, seed: int):
    """A decode batch (GQA 7, page 16) of these lengths over an fp32 pool or its FP8 copy (x 8, scales
    1/8), with NaN in every slot no request reads: (q, k_buffer, v_buffer, page_table, seq_lens,
    scales, config kind, reference output)."""
    b = paged_batch([max(0, s - 1) for s in seq_lens], [1] * len(seq_lens), 16, 7, 1, head_dim, torch.float32,
                    seed=seed)
    kb, vb = b.k_buffer, b.v_buffer
    scales = {}
    if pool == "fp8":
        kb, vb = kb.mul(8).to(torch.float8_e4m3fn), vb.mul(8).to(torch.float8_e4m3fn)
        scales = {"k_scale": 0.125, "v_scale": 0.125}
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=b.q.device)
    kb, vb = (_poison_unread_slots(x, b.page_table, lens, 16) for x in (kb, vb))
    q = b.q[: len(seq_lens)].contiguous()
    ref = decode_attention_ref(q, kb, vb, b.page_table, lens, 16, None, **scales)
    return q, kb, vb, b.page_table, lens, scales, "decode_fp8" if pool == "fp8" else "decode", ref


@pytest.mark.parametrize("block_n, warps", [(32, 2), (64, 4)])
@pytest.mark.parametrize("pool", ["fp32", "fp8"])
@pytest.mark.parametrize("head_dim", [64, 80])
def test_warp_split_matches_reference(paged_batch, monkeypatch, pool, head_dim, block_n, warps):
    """decode with warp_split (each key block split across the warps, per-warp softmax states merged
    after the loop: kernels/paged_loop.py paged_attn_loop_ws) against the reference: lengths at, one
    past and one short of a block and of a warp's sub-block (so some warps see no key in the last
    block, or none at all), 1-8 splits (empty ones among them), a zero-length row, NaN in every slot
    no request reads; head dim 80 takes the masked loads in every block."""
    from radixrt.kernels import attention_configs as ac
    from radixrt.kernels.decode_attention import warp_split

    q, kb, vb, table, lens, scales, kind, ref = _poisoned_decode_case(
        paged_batch, [1, 15, 16, 17, 31, 32, 33, 47, 64, 65, 100, 0], pool, head_dim, seed=12)
    cfg = {**ac.CPU[kind], "BLOCK_N": block_n, "num_warps": warps, "warp_split": True}
    monkeypatch.setitem(ac.CPU, kind, cfg)
    assert warp_split({**ac.CPU[kind], "KV_DOT": "q"}) == warps
    for splits in (1, 3, 8):
        out = decode_attention(q, kb, vb, table, lens, 16, None, splits, **scales)
        assert not torch.isnan(out).any(), f"{splits} splits"
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.usefixtures("no_attention_overrides")
def test_warp_split_rejects_configs_it_cannot_run():
    from radixrt.kernels import attention_configs as ac
    from radixrt.kernels.decode_attention import warp_split

    assert warp_split({"BLOCK_N": 128, "num_warps": 4, "KV_DOT": "q"}) == 0  # not set: off
    assert warp_split({"BLOCK_N": 128, "num_warps": 4, "KV_DOT": "f16", "warp_split": True}) == 4
    with pytest.raises(ValueError, match="16"):
        warp_split({"BLOCK_N": 64, "num_warps": 8, "KV_DOT": "q", "warp_split": True})  # 8 keys per warp
    with pytest.raises(ValueError, match="kv_dot"):
        warp_split({"BLOCK_N": 128, "num_warps": 4, "KV_DOT": "f16v", "warp_split": True})
    with pytest.raises(ValueError, match="warp_split"):
        ac.set_overrides({"decode": {"d128": {"warp_split": 2}}})
    with pytest.raises(ValueError, match="power of two"):
        warp_split({"BLOCK_N": 48, "num_warps": 2, "KV_DOT": "q", "warp_split": True})  # 24 keys per warp
    with pytest.raises(ValueError, match="warp_split"):
        ac.set_overrides({"decode_fp8": {"d128": {"many": {"warp_split": "yes"}}}})
    # an override is checked at load in every config it lets a launch take, not at the launch:
    with pytest.raises(ValueError, match="kv_dot"):  # the "many" entries (kv_dot "f16v") inherit it
        ac.set_overrides({"decode_fp8": {"d128": {"warp_split": True}}})
    with pytest.raises(ValueError, match="BLOCK_N 64 = num_warps 8"):  # the "long" entries: 8 keys per warp
        ac.set_overrides({"decode_fp8": {"d128": {"long": {"num_warps": 8}}}})
    with pytest.raises(ValueError, match="BLOCK_N 64 = num_warps 8"):  # the d128 entry's 8 warps
        ac.set_overrides({"decode": {"d128": {"warp_split": True, "BLOCK_N": 64}}})
    # a variant that is never taken (many_per_sm 0) is not held against the entry
    ac.set_overrides({"decode": {"d128": {"BLOCK_N": 32, "num_warps": 2, "many_per_sm": 0,
                                          "warp_split": True}}})
    assert ac.attention_config("decode", 128)["warp_split"] is True


@pytest.mark.parametrize("peel", [1, 2])
@pytest.mark.parametrize("pool", ["fp32", "fp8"])
@pytest.mark.parametrize("head_dim", [64, 80])
def test_peel_tail_equals_the_masked_loop(paged_batch, monkeypatch, pool, head_dim, peel):
    """decode's PEEL_TAIL (whole key blocks unmasked, the partial last one after the loop: 1 through
    masked loads, 2 through selects on whole loads) gives the masked loop's result bit for bit:
    sequence lengths at, one past and one short of the interpreter's 16-key blocks, 1-8 splits
    (empty ones among them), a zero-length row, and NaN in every slot no request reads (a wrongly
    unmasked load would spread it). Head dim 80 pads to 128 columns, where the launcher keeps the
    mask (PEEL_TAIL needs whole rows)."""
    from radixrt.kernels import attention_configs as ac

    q, kb, vb, table, lens, scales, kind, ref = _poisoned_decode_case(
        paged_batch, [1, 15, 16, 17, 32, 47, 100, 0], pool, head_dim, seed=11)
    for splits in (1, 3, 8):
        outs = []
        for mode in (0, peel):
            monkeypatch.setitem(ac.CPU[kind], "peel_tail", mode)
            outs.append(decode_attention(q, kb, vb, table, lens, 16, None, splits, **scales))
        assert torch.equal(outs[0], outs[1]), f"{splits} splits"
        assert not torch.isnan(outs[1]).any()
        torch.testing.assert_close(outs[1], ref, atol=1e-4, rtol=1e-4)
