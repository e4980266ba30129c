"""cascade_decode_attention (shared prefix read once per group) against plain decode attention:
groups of several sizes plus requests in no group, page sizes 1/16/64, GQA 1/4/7, head dims 32/64/80,
suffixes of 0, 1 and more tokens, prefixes that end inside a page, empty and padded groups, 1 and
several prefix splits; decode_attention's kv_start; launcher errors."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from radixrt.kernels import (
    CascadeTile,
    cascade_decode_attention,
    choose_num_prefix_splits,
    decode_attention,
)
from radixrt.kernels.reference import (
    assert_groups_share_prefix,
    cascade_decode_attention_ref,
    decode_attention_ref,
)

from .conftest import DEVICE, make_paged_batch

TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3)}


@dataclass
class CascadeBatch:
    q: torch.Tensor  # [B, Hq, D], strided rows
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    page_table: torch.Tensor  # [B, P] int32; members share their group's prefix pages
    seq_lens: torch.Tensor
    kv_start: torch.Tensor
    group_members: torch.Tensor
    group_starts: torch.Tensor
    group_prefix_lens: torch.Tensor
    max_group_size: int

    def args(self, page_size: int) -> tuple:
        return (self.q, self.k_buffer, self.v_buffer, self.page_table, self.seq_lens, self.kv_start,
                self.group_members, self.group_starts, self.group_prefix_lens, page_size, None)


def make_cascade_batch(groups: list[tuple[int, list[int]]], loner_lens: list[int], page_size: int, hq: int,
                       hkv: int, head_dim: int, dtype: torch.dtype, seed: int = 0) -> CascadeBatch:
    """groups: (prefix_len, suffix lens of its members); loner_lens: seq_lens of requests in no group.
    Requests are shuffled over the batch; each member's first cdiv(prefix_len, page_size) pages are
    replaced by the group's first member's pages, so the prefix is physically shared."""
    owners = [(g, prefix + sfx) for g, (prefix, sfxs) in enumerate(groups) for sfx in sfxs]
    owners += [(-1, n) for n in loner_lens]
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(owners), generator=gen).tolist()  # batch row of request i
    seq_lens = [0] * len(owners)
    for i, (_, n) in enumerate(owners):
        seq_lens[order[i]] = n
    b = make_paged_batch(seq_lens, [0] * len(seq_lens), page_size, hq, hkv, head_dim, dtype, seed=seed)
    table = b.page_table.cpu()
    kv_start = [0] * len(owners)
    members: list[int] = []
    starts = [0]
    for g, (prefix, _) in enumerate(groups):
        rows = [order[i] for i, (owner, _) in enumerate(owners) if owner == g]
        for r in rows:
            table[r, : -(-prefix // page_size)] = table[rows[0], : -(-prefix // page_size)]
            kv_start[r] = prefix
        members += rows
        starts.append(len(members))
    q = torch.randn(len(owners), hq + 1, head_dim, generator=gen).to(dtype=dtype, device=DEVICE)[:, 1:]
    ints = dict(dtype=torch.int32, device=DEVICE)
    return CascadeBatch(q, b.k_buffer, b.v_buffer, table.to(DEVICE), b.seq_lens,
                        torch.tensor(kv_start, **ints),
                        torch.tensor(members, **ints), torch.tensor(starts, **ints),
                        torch.tensor([p for p, _ in groups], **ints),
                        max([len(s) for _, s in groups], default=0))


CASES = [
    # groups (prefix_len, suffix lens), loner seq_lens, page_size, Hq, Hkv, D, dtype, kv splits, prefix
    # splits, tile
    pytest.param([(32, [1, 5, 20]), (16, [3])], [40, 9], 16, 8, 2, 64, torch.float32, 2, 2, None,
                 id="page16-gqa4-two-groups-loners"),
    pytest.param([(32, [1, 5, 20]), (16, [3])], [40], 16, 8, 2, 64, torch.float16, 1, 1, CascadeTile(32, 32),
                 id="page16-gqa4-fp16-tile32"),
    pytest.param([(7, [1, 1]), (3, [4, 2, 6])], [5], 1, 2, 2, 32, torch.float16, 1, 1, None,
                 id="page1-mha-fp16"),
    pytest.param([(64, [1, 30, 2, 0, 7])], [0, 70], 64, 7, 1, 80, torch.float16, 3, 3, None,
                 id="page64-gqa7-d80-empty-suffix-zero-row"),
    pytest.param([(20, [1, 4]), (0, [5]), (50, [])], [], 16, 4, 1, 64, torch.float32, 2, 4, None,
                 id="page16-unaligned-prefix-empty-groups-4-prefix-splits"),
    pytest.param([(16, []), (32, [1, 2, 3, 4, 5, 6, 7, 8, 9]), (16, [2, 3]), (32, [])], [11], 16, 8, 2, 64,
                 torch.float32, 2, 3, None, id="page16-leading-empty-group-multi-block-group"),
    # one suffix split: the suffix program merges the prefix partials itself (no merge launch)
    pytest.param([(64, [1, 30, 2, 0, 7])], [0, 70], 64, 7, 1, 80, torch.float16, 1, 3, None,
                 id="fused-page64-gqa7-d80-empty-suffix-zero-row"),
    pytest.param([(20, [1, 4]), (0, [5]), (50, [])], [33], 16, 4, 1, 64, torch.float32, 1, 4, None,
                 id="fused-page16-unaligned-prefix-empty-groups-4-prefix-splits"),
    pytest.param([(16, []), (32, [1, 2, 3, 4, 5, 6, 7, 8, 9]), (16, [2, 3]), (32, [])], [11], 16, 8, 2, 64,
                 torch.float32, 1, 3, None, id="fused-page16-leading-empty-group-multi-block-group"),
]


@pytest.mark.parametrize("groups, loners, page_size, hq, hkv, head_dim, dtype, splits, prefix_splits, tile",
                         CASES)
def test_cascade_matches_plain_decode(close, groups, loners, page_size, hq, hkv, head_dim, dtype, splits,
                                      prefix_splits, tile):
    c = make_cascade_batch(groups, loners, page_size, hq, hkv, head_dim, dtype, seed=splits + prefix_splits)
    batch = c.q.shape[0]
    out = torch.full(c.q.shape, float("nan"), dtype=dtype, device=DEVICE)
    mid_o = torch.full((batch, hq, splits + prefix_splits, head_dim), float("nan"), device=DEVICE)
    mid_lse = torch.full((batch, hq, splits + prefix_splits), float("nan"), device=DEVICE)
    # one spare group row of padding (max_group_size + 1): padding rows must neither write nor matter
    o = cascade_decode_attention(*c.args(page_size), splits, prefix_splits, c.max_group_size + 1, out=out,
                                 mid_o=mid_o, mid_lse=mid_lse, tile=tile)
    ref = cascade_decode_attention_ref(*c.args(page_size))
    assert o is out
    close(o, ref, *TOL[dtype])
    # and it is plain decode attention over the whole sequence
    plain = decode_attention(c.q, c.k_buffer, c.v_buffer, c.page_table, c.seq_lens, page_size, None, splits)
    close(o, plain, *TOL[dtype])


def test_decode_attention_kv_start(paged_batch, close):
    b = paged_batch([0, 32, 49, 8, 19], [1] * 5, 16, 4, 2, 64, torch.float32, seed=3)
    kv_start = torch.tensor([0, 17, 49, 9, 30], dtype=torch.int32,
                            device=DEVICE)  # 9 == seq_len, 30 > seq_len
    args = (b.q, b.k_buffer, b.v_buffer, b.page_table, b.seq_lens, 16, None, 3)
    o = decode_attention(*args, kv_start=kv_start)
    ref = decode_attention_ref(b.q, b.k_buffer, b.v_buffer, b.page_table, b.seq_lens, 16, None,
                               kv_start=kv_start)
    close(o, ref, *TOL[torch.float32])
    assert torch.equal(o[3:], torch.zeros_like(o[3:]))  # empty ranges give zero rows
    # kv_start = 0 is the whole sequence, like no kv_start at all
    whole = decode_attention_ref(b.q, b.k_buffer, b.v_buffer, b.page_table, b.seq_lens, 16, None)
    close(decode_attention(*args, kv_start=torch.zeros_like(kv_start)), whole, *TOL[torch.float32])
    close(decode_attention(*args), whole, *TOL[torch.float32])


def _bad(c: CascadeBatch, **change) -> dict:
    kw = dict(q=c.q, k_buffer=c.k_buffer, v_buffer=c.v_buffer, page_table=c.page_table, seq_lens=c.seq_lens,
              kv_start=c.kv_start, group_members=c.group_members, group_starts=c.group_starts,
              group_prefix_lens=c.group_prefix_lens, page_size=16, scale=None, num_kv_splits=1,
              num_prefix_splits=1, max_group_size=c.max_group_size)
    return {**kw, **change}


@pytest.mark.parametrize("change, msg", [
    (lambda c: dict(group_prefix_lens=c.group_prefix_lens[:0]), "group_prefix_lens must be"),
    (lambda c: dict(group_starts=c.group_starts.float()), "group_starts must be"),
    (lambda c: dict(group_starts=c.group_starts[:0]), "group_starts must be"),
    (lambda c: dict(group_members=c.group_members[None]), "group_members must be"),
    (lambda c: dict(kv_start=c.kv_start[:-1]), "kv_start must be"),
    (lambda c: dict(kv_start=None), "kv_start is required"),
    (lambda c: dict(num_prefix_splits=0), "num_prefix_splits"),
    (lambda c: dict(max_group_size=0), "max_group_size"),
    (lambda c: dict(mid_o=torch.zeros(c.q.shape[0], 4, 1, 64)), "mid_o must be"),
    (lambda c: dict(q=c.q.double()), "q is torch.float64"),
    (lambda c: dict(tile=(16, 16)), "tile must be"),
])
def test_cascade_launcher_rejects_bad_arguments(change, msg):
    c = make_cascade_batch([(16, [1, 2])], [3], 16, 4, 2, 64, torch.float32)
    with pytest.raises(ValueError, match=msg):
        cascade_decode_attention(**_bad(c, **change(c)))
    with pytest.raises(ValueError, match="power of two"):
        CascadeTile(8, 16)


def test_reference_rejects_unshared_prefix():
    c = make_cascade_batch([(32, [1, 2])], [], 16, 2, 1, 32, torch.float32)
    assert_groups_share_prefix(c.page_table, c.seq_lens, c.kv_start, c.group_members, c.group_starts,
                               c.group_prefix_lens, 16)
    table = c.page_table.clone()
    table[int(c.group_members[1]), 1] = table[int(c.group_members[1]), 1] + 1000
    with pytest.raises(AssertionError, match="does not share"):
        assert_groups_share_prefix(table, c.seq_lens, c.kv_start, c.group_members, c.group_starts,
                                   c.group_prefix_lens, 16)


def test_choose_num_prefix_splits():
    # at most one program per SM (132): 7 row blocks x 4 KV heads = 28 programs per split
    assert choose_num_prefix_splits(1, 128, 28, 4, 2048) == 4
    assert choose_num_prefix_splits(1, 128, 28, 4, 2048, block_m=64) == 2  # 14 row blocks x 4 KV heads
    assert choose_num_prefix_splits(1, 256, 28, 4, 2048) == 2  # 14 row blocks x 4 KV heads
    assert choose_num_prefix_splits(4, 32, 28, 4, 2048) == 4  # 4 x 2 row blocks x 4 KV heads
    assert choose_num_prefix_splits(1, 32, 28, 4, 2048,
                                    max_splits=4) == 4  # 2 row blocks: capped by the caller
    assert choose_num_prefix_splits(1, 2, 28, 4, 300) == 2  # short prefix: >= 256 tokens per split
    assert choose_num_prefix_splits(64, 128, 28, 4, 32768) == 1  # many groups fill the GPU alone
    assert choose_num_prefix_splits(1, 1, 8, 8, 1 << 20) == 16  # capped
    for groups in (0, 1, 8):
        for n in (0, 1, 5000):
            assert 1 <= choose_num_prefix_splits(groups, 16, 28, 4, n) <= 16


@pytest.mark.parametrize("option", ["remat_rows", "blocks_last"])
@pytest.mark.parametrize("case", [pytest.param(c.values, id=c.id) for c in CASES
                                  if "multi-block" in c.id or "empty-groups" in c.id])
def test_prefix_stage_options_change_nothing(monkeypatch, case, option):
    """The prefix kernel's options write the same bits as the default, padding rows, empty (and
    leading empty) groups and several row blocks per group included: config "cascade" remat_rows
    (the rows' requests and heads recomputed for the stores rather than held through the loop) and
    blocks_last (the grid's row-block axis last, so spare blocks start after the real ones)."""
    from radixrt.kernels import attention_configs as ac

    groups, loners, page_size, hq, hkv, head_dim, dtype, splits, prefix_splits, tile = case
    c = make_cascade_batch(groups, loners, page_size, hq, hkv, head_dim, dtype, seed=5)
    outs = []
    for on in (False, True):
        monkeypatch.setitem(ac.CPU["cascade"], option, on)
        mid_o = torch.full((c.q.shape[0], hq, splits + prefix_splits, head_dim), float("nan"), device=DEVICE)
        mid_lse = torch.full((c.q.shape[0], hq, splits + prefix_splits), float("nan"), device=DEVICE)
        outs.append((cascade_decode_attention(*c.args(page_size), splits, prefix_splits, c.max_group_size + 1,
                                              mid_o=mid_o, mid_lse=mid_lse, tile=tile), mid_o, mid_lse))
    for a, b in zip(outs[0], outs[1], strict=True):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))  # unwritten slots stay NaN in both
    assert not torch.isnan(outs[1][0]).any()
