"""The CPU attention backends (paged) vs a dense per-request reference: random page placement, GQA,
prefixes ending inside a page, mixed extend/decode batches. TorchAttnBackend is the plain reference;
SdpaAttnBackend (torch's fused kernels, the CPU default) must match it on the same cases, with its
K/V read through gathers (random pages) and through views (consecutive pages)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from radixrt.attention.base import ForwardMeta
from radixrt.protocol import ForwardMode
from radixrt.worker import cpu_native
from radixrt.worker.attention_sdpa import SdpaAttnBackend
from radixrt.worker.attention_torch import TorchAttnBackend
from radixrt.worker.kv_pool import PagedKVPool


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int,
                    scale: float) -> torch.Tensor:
    """q [L, Hq, D], k/v [S, Hkv, D] (whole sequence), new token j at position prefix_len + j."""
    rep = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(rep, dim=1)  # [S, Hq, D]
    v = v.double().repeat_interleave(rep, dim=1)
    scores = torch.einsum("lhd,shd->hls", q.double(), k) * scale  # [Hq, L, S]
    qpos = prefix_len + torch.arange(q.shape[0])[:, None]
    mask = torch.arange(k.shape[0])[None, :] <= qpos  # [L, S]
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hls,shd->lhd", scores.softmax(-1), v)


def run_case(page_size: int, prefix_lens: list[int], extend_lens: list[int], hq: int, hkv: int,
             seed: int, max_score_elems: int = 1 << 24, backend_name: str = "torch",
             consecutive: bool = False, shared_pages: int = 0, dtype: torch.dtype = torch.float32
             ) -> TorchAttnBackend | SdpaAttnBackend:
    """Random K/V for each request, prefix already in the pool; pages in random order, or in
    consecutive runs per request (`consecutive`), never page 0. With `shared_pages`, every request
    after the first starts with the first request's first `shared_pages` pages (and their K/V), as
    the radix cache hands out a shared prefix; their prefixes must cover those pages. `dtype`: the
    pool's and q/k/v's (the reference computes in float64 from the same rounded values)."""
    g = torch.Generator().manual_seed(seed)
    d, layers = 16, 2
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    pages_needed = [math.ceil(s / page_size) for s in seq_lens]
    num_pages = sum(pages_needed) + 5
    pool = PagedKVPool(num_pages, page_size, layers, hkv, d, dtype, "cpu")
    perm = (torch.randperm(num_pages - 1, generator=g) + 1).tolist()  # never page 0
    if consecutive:
        perm = list(range(num_pages - 1, 0, -1))  # popped from the end: 1, 2, 3, ...
    max_pages = max(pages_needed) + 2
    table = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    full_k, full_v, locs = [], [], []
    for b, n in enumerate(pages_needed):
        own = shared_pages if b > 0 else 0
        table[b, :own] = table[0, :own]
        table[b, own:n] = torch.tensor([perm.pop() for _ in range(n - own)], dtype=torch.int32)
        slots = table[b, torch.arange(seq_lens[b]) // page_size].long() * page_size \
            + torch.arange(seq_lens[b]) % page_size
        kk = torch.randn(layers, seq_lens[b], hkv, d, generator=g).to(dtype)
        vv = torch.randn(layers, seq_lens[b], hkv, d, generator=g).to(dtype)
        if b > 0 and shared_pages:
            assert prefix_lens[b] >= shared_pages * page_size <= prefix_lens[0]
            kk[:, :shared_pages * page_size] = full_k[0][:, :shared_pages * page_size]
            vv[:, :shared_pages * page_size] = full_v[0][:, :shared_pages * page_size]
        for layer in range(layers):  # the prefix is already in the pool
            pool.k_buffers[layer][slots[:prefix_lens[b]]] = kk[layer, :prefix_lens[b]]
            pool.v_buffers[layer][slots[:prefix_lens[b]]] = vv[layer, :prefix_lens[b]]
        full_k.append(kk)
        full_v.append(vv)
        locs.append(slots[prefix_lens[b]:])
    t = sum(extend_lens)
    ext = torch.tensor(extend_lens, dtype=torch.int32)
    starts = torch.cumsum(ext, 0) - ext
    meta = ForwardMeta(
        mode=ForwardMode.MIXED, page_size=page_size, page_table=table,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), extend_lens=ext,
        prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32), extend_start_loc=starts.int(),
        out_cache_loc=torch.cat(locs),
        positions=torch.cat([torch.arange(p, p + e) for p, e in zip(prefix_lens, extend_lens, strict=True)]),
        max_seq_len=max(seq_lens), max_extend_len=max(extend_lens))
    if backend_name == "torch":
        backend = TorchAttnBackend(pool, max_score_elems=max_score_elems)
    elif backend_name == "native":
        if cpu_native.load() is None:
            pytest.skip("no C compiler: the native CPU decode kernel is not built")
        backend = SdpaAttnBackend(pool, native=True)
    else:
        backend = SdpaAttnBackend(pool, native=False)
    backend.prepare(meta)
    scale = d ** -0.5
    for layer in range(layers):
        q = torch.randn(t, hq, d, generator=g).to(dtype)
        k = torch.cat([full_k[b][layer, prefix_lens[b]:] for b in range(len(seq_lens))])
        v = torch.cat([full_v[b][layer, prefix_lens[b]:] for b in range(len(seq_lens))])
        out = backend.forward(q, k, v, layer, scale)
        for b in range(len(seq_lens)):
            s = int(starts[b])
            ref = dense_reference(q[s:s + extend_lens[b]], full_k[b][layer], full_v[b][layer],
                                  prefix_lens[b], scale)
            tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: P and the output rounded to 8 bits
            torch.testing.assert_close(out[s:s + extend_lens[b]].double(), ref, atol=tol, rtol=tol)
        # The new K/V landed in the pool at out_cache_loc.
        torch.testing.assert_close(pool.k_buffers[layer][meta.out_cache_loc], k)
    return backend


BACKENDS = ["torch", "sdpa", "native"]


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (6, 1)])
def test_mixed_batch_matches_dense(page_size: int, hq: int, hkv: int, backend_name: str) -> None:
    # prefixes ending inside a page (17, 63, 5), page-aligned (64, 0), decodes (ext 1) and extends
    prefix_lens = [0, 17, 64, 63, 5, 100, 0]
    extend_lens = [9, 30, 1, 1, 70, 1, 1]
    run_case(page_size, prefix_lens, extend_lens, hq, hkv, seed=page_size * 100 + hq,
             backend_name=backend_name)


@pytest.mark.parametrize("page_size", [1, 16])
def test_sdpa_bfloat16_pool(page_size: int) -> None:
    """A bf16 pool (`--dtype bfloat16` on CPU): lone decodes in one run and in scattered pages,
    decodes sharing a prefix, extends over a prefix and from nothing, within bf16's rounding."""
    backend = run_case(page_size, [64, 70, 100, 80], [1, 1, 1, 9], 6, 2, seed=7, backend_name="sdpa",
                       shared_pages=64 // page_size, dtype=torch.bfloat16)
    assert any(len(g.own) > 1 for g in backend.groups)  # a group reading its shared pages once
    backend = run_case(page_size, [0, 40, 90, 3, 33], [5, 1, 1, 20, 1], 8, 2, seed=8, backend_name="sdpa",
                       dtype=torch.bfloat16)
    assert all(len(g.own) == 1 for g in backend.groups)  # lone decodes, alone or batched
    assert len(backend.groups) + sum(lb.q_rows.numel() for lb in backend.lone_batches) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
def test_sdpa_scattered_lone_decodes_attend_in_one_batch(page_size: int, dtype: torch.dtype) -> None:
    """Lone decodes whose pages are scattered (gathered anyway) of similar lengths go through one
    gather and one flash call, padded to the longest and masked; a much longer one stays alone."""
    backend = run_case(page_size, [50, 60, 55, 300, 0], [1, 1, 1, 1, 5], 8, 2, seed=12, backend_name="sdpa",
                       dtype=dtype)
    (lb,) = backend.lone_batches
    assert sorted(lb.q_rows.tolist()) == [0, 1, 2] and lb.max_len == 61 and lb.mask is not None
    assert (lb.mask[:, 0, 0] == 0).sum(-1).tolist() == [61, 56, 51]  # each member's own tokens
    (alone,) = backend.groups  # the 301-token one: padding the others to it would cost more
    assert int(alone.q_rows[0]) == 3


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_sdpa_consecutive_pages_read_as_views(page_size: int) -> None:
    """Each request's pages in one consecutive run: the SDPA backend reads them as one view (extend)
    or one run (decode: requests 2, 3, 5 and 7, each alone)."""
    prefix_lens, extend_lens = [0, 17, 64, 63, 5, 100, 0, 1], [9, 30, 1, 1, 70, 1, 1, 1]
    backend = run_case(page_size, prefix_lens, extend_lens, 8, 2, seed=page_size + 1, backend_name="sdpa",
                       consecutive=True)
    kinds = [("new" if p.from_new else "view" if p.prefix_pages is None else "gather") for p in backend.plans]
    assert kinds == ["new", "view", "view", "new"]
    assert [len(p.prefix_runs) for p in backend.plans] == [0, 1, 1, 0]
    assert [(len(g.shared), g.own) for g in backend.groups] == [(1, [[]])] * 4
    assert sorted(n for g in backend.groups for _, n in g.shared) == [2, 64, 65, 101]


def test_sdpa_random_pages_are_gathered() -> None:
    """An extend's prefix in a few runs is read as views of them, in more than MAX_VIEW_RUNS runs as
    one gather of its pages."""
    from radixrt.worker.attention_sdpa import MAX_VIEW_RUNS

    backend = run_case(16, [17, 100, 0, 200], [30, 1, 5, 9], 8, 2, seed=11, backend_name="sdpa")
    kinds = [("new" if p.from_new else "view" if p.prefix_pages is None else "gather") for p in backend.plans]
    assert kinds == ["view", "new", "gather"]
    assert [len(p.prefix_runs) for p in backend.plans] == [2, 0, len(backend.plans[2].prefix_runs)]
    assert len(backend.plans[2].prefix_runs) > MAX_VIEW_RUNS
    assert backend.plans[2].prefix_pages.numel() == 13
    (group,) = backend.groups  # the lone decode's 101 tokens lie in several runs (read with one gather)
    assert sum(n for _, n in group.shared) == 101 and len(group.shared) > 1


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_sdpa_decodes_sharing_prefix_pages_read_them_once(page_size: int) -> None:
    """Decodes whose page tables start with the same pages form one group that reads the shared
    runs once; an extend over the same pages and a decode sharing too little attend alone."""
    shared = 128 // page_size
    prefix_lens, extend_lens = [200, 130, 128, 300, 129, 140], [1, 1, 20, 1, 1, 1]
    backend = run_case(page_size, prefix_lens, extend_lens, 8, 2, seed=page_size + 5, backend_name="sdpa",
                       shared_pages=shared)
    by_size = sorted(backend.groups, key=lambda g: len(g.own))
    assert [len(g.own) for g in by_size] == [5]  # the decodes 0, 1, 3, 4, 5 share 128 tokens
    (group,) = by_size
    assert sum(n for _, n in group.shared) == 128
    assert [sum(n for _, n in runs) for runs in group.own] == [73, 3, 173, 2, 13]
    assert group.q_rows.tolist() == [0, 1, 22, 23, 24]


@pytest.mark.parametrize("page_size", [1, 16])
def test_query_blocking_and_decode_chunking(page_size: int) -> None:
    # a tiny score budget forces extend queries into many blocks and decodes into many groups
    run_case(page_size, [3, 40, 0, 7, 19], [50, 1, 1, 33, 1], 8, 2, seed=7, max_score_elems=200)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_decode_only_batch(backend_name: str) -> None:
    run_case(16, [15, 16, 31, 1, 200], [1, 1, 1, 1, 1], 4, 2, seed=3, backend_name=backend_name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_native_decode_groups_and_lone_decodes(page_size: int, dtype: torch.dtype) -> None:
    """The native kernel: decodes sharing a prefix's pages (one item for the shared pages attended by
    every member, one per member for its own), a decode sharing too little (alone), an extend over
    the same pages beside them; exact against the reference in fp32 and bf16 pools."""
    backend = run_case(page_size, [200, 130, 128, 300, 129, 140], [1, 1, 20, 1, 1, 1], 8, 2,
                       seed=page_size + 21, backend_name="native", shared_pages=128 // page_size, dtype=dtype)
    plan = backend.native_plan
    assert not backend.groups and not backend.lone_batches and not backend.plans  # all to the kernel
    assert plan.q_rows.tolist() == [0, 1, 22, 23, 24, *range(2, 22)]  # decode rows, then the extend's
    # the decodes' shared 128 tokens are one item of all five members, each member's own tokens one
    # item; the extend's 128-token prefix one item of its 20 rows, its new tokens one causal item of them
    assert plan.item_ntok.tolist() == [128, 73, 3, 173, 2, 13, 128, 20]
    assert plan.item_nmem.tolist() == [5, 1, 1, 1, 1, 1, 20, 20]
    assert plan.item_causal.tolist() == [0] * 7 + [1]
    assert np.diff(plan.row_part_ptr).tolist() == [2] * 25  # shared / prefix + own, merged per row


def test_native_takes_short_extends_only() -> None:
    """Extends up to NATIVE_EXTEND_MAX new tokens (with or without a prefix) go to the native kernel;
    a longer one keeps the torch flash path."""
    from radixrt.worker.attention_sdpa import NATIVE_EXTEND_MAX

    n = NATIVE_EXTEND_MAX
    backend = run_case(16, [40, 0, 30, 7], [n, 5, n + 1, 1], 8, 2, seed=31, backend_name="native")
    assert [p.extend_len for p in backend.plans] == [n + 1]
    assert backend.native_plan.q_rows.numel() == n + 5 + 1


@pytest.mark.parametrize("hq,hkv", [(8, 2), (48, 2), (80, 2), (4, 4)])
def test_native_long_decodes_split_and_many_query_heads(hq: int, hkv: int) -> None:
    """Items past SPLIT_TOKENS are split into pieces merged by log-sum-exp, and a KV head with more
    query heads than one unit's 16 lanes (48 / 2 = 24: a 32-lane unit) or 32 (80 / 2 = 40) spans
    several units."""
    n = cpu_native.SPLIT_TOKENS
    backend = run_case(16, [2 * n + 37, 5, n], [1, 1, 1], hq, hkv, seed=hq, backend_name="native")
    assert np.diff(backend.native_plan.row_part_ptr).tolist() == [3, 1, 2]


def test_native_kernel_matches_dense_on_scattered_slots() -> None:
    """The kernel alone (head_dim 64, 3 KV heads of 3 query heads: the default model's shape) over
    slots in random order, against a dense softmax in float64."""
    if cpu_native.load() is None:
        pytest.skip("no C compiler: the native CPU decode kernel is not built")
    g = torch.Generator().manual_seed(5)
    k_buf, v_buf = torch.randn(5000, 3, 64, generator=g), torch.randn(5000, 3, 64, generator=g)
    q = torch.randn(4, 9, 64, generator=g)
    slot_lists = [torch.randperm(4999, generator=g)[:n].numpy() + 1 for n in (1, 15, 700, 1029)]
    items = [(s.astype(np.int64), [i]) for i, s in enumerate(slot_lists)]
    plan = cpu_native.DecodePlan.build([3, 0, 1, 2], items)
    out = cpu_native.decode_attention(q, k_buf, v_buf, plan, 0.125)
    for i, (row, slots) in enumerate(zip([3, 0, 1, 2], slot_lists, strict=True)):
        kk, vv = k_buf[slots].double().transpose(0, 1), v_buf[slots].double().transpose(0, 1)  # [3, S, 64]
        qq = q[row].double().view(3, 3, 64)
        ref = ((qq @ kk.transpose(1, 2)) * 0.125).softmax(-1) @ vv
        torch.testing.assert_close(out[i].double(), ref.reshape(9, 64), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("d,hq,hkv", [(64, 9, 3), (128, 8, 1), (80, 6, 2), (48, 4, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_kernel_unit_shapes(d: int, hq: int, hkv: int, dtype: torch.dtype) -> None:
    """The kernel alone on items of 1..13 members (1..104 query vectors per KV head: units of 32, 16
    and 8 lanes and every remainder of the register blocks), lengths not multiples of a block,
    head_dim 64 / 128 and ones that are not multiples of 64, split items merged, causal items (member
    m of M attends the first n - M + m + 1 slots; kept whole past split_tokens), and keys whose
    scores grow along the sequence (the running max moves many times), against float64."""
    if cpu_native.load() is None:
        pytest.skip("no C compiler: the native CPU decode kernel is not built")
    g = torch.Generator().manual_seed(d + hq)
    n_slots = 3000
    k_buf = torch.randn(n_slots, hkv, d, generator=g)
    k_buf *= torch.linspace(0.5, 4.0, n_slots)[:, None, None]  # scores grow with the slot
    v_buf = torch.randn(n_slots, hkv, d, generator=g)
    k_buf, v_buf = k_buf.to(dtype), v_buf.to(dtype)
    members = [1, 2, 3, 5, 6, 11, 13]
    n_rows = sum(members)
    q = torch.randn(n_rows, hq, d, generator=g)
    items, row = [], 0
    for i, m in enumerate(members):
        n = [1, 7, 9, 100, 333, 517, 1001][i]
        slots = torch.randperm(n_slots, generator=g)[:n].sort().values.numpy().astype(np.int64)
        items.append((slots, list(range(row, row + m))))
        row += m
    for n, rows in [(13, range(28, 41)), (50, range(30, 41)), (6, range(0, 6)), (330, range(11, 41))]:
        slots = torch.randperm(n_slots, generator=g)[:n].sort().values.numpy().astype(np.int64)
        items.append((slots, list(rows), True))
    plan = cpu_native.DecodePlan.build(list(range(n_rows)), items, split_tokens=300)
    scale = d ** -0.5
    out = cpu_native.decode_attention(q, k_buf, v_buf, plan, scale)
    rep = hq // hkv
    row_slots: list[list[np.ndarray]] = [[] for _ in range(n_rows)]  # each row's keys, all its items
    for slots, rows, *causal in items:
        for m, r in enumerate(rows):
            row_slots[r].append(slots[:len(slots) - len(rows) + m + 1] if causal else slots)
    for r in range(n_rows):
        slots = np.concatenate(row_slots[r])
        kk = k_buf[slots].double().repeat_interleave(rep, dim=1).transpose(0, 1)  # [Hq, S, D]
        vv = v_buf[slots].double().repeat_interleave(rep, dim=1).transpose(0, 1)
        qq = q[r].double()[:, None]  # [Hq, 1, D]
        ref = ((qq @ kk.transpose(1, 2)) * scale).softmax(-1) @ vv  # [Hq, 1, D]
        torch.testing.assert_close(out[r].double(), ref[:, 0], atol=1e-5, rtol=1e-5)
