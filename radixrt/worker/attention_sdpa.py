"""CPU attention over the paged K/V pool (the default on CPU).

Per pass (`prepare`, one read of the lengths and page-table rows on the host) the requests are
planned: where each one's K/V rows [0, seq_len) live in the pool.
Per layer (`forward`): store the new K/V at out_cache_loc, then attend.

With the native kernel (`cpu_native`, `kernels/cpu_native.c`; on when a C compiler builds it and the
pool is float32 / bfloat16 with head_dim a multiple of 16) every decode request and every extend of
at most `NATIVE_EXTEND_MAX` new tokens is one call per layer that reads K/V straight from the pool's
slots (no gather): decodes whose page-table rows start with the same pages (a shared system prompt,
one conversation's history: the radix cache hands out the same physical pages) read the shared
pages once for the whole group (cascade inference, FlashInfer, Ye et al. 2024; Hydragen, Juravsky et
al. 2024), an extend's cached prefix is read once for all its query rows, and the parts are merged
by log-sum-exp (`native_plan`).

Without it (`RADIXRT_CPU_NATIVE=0`, or no compiler), decode requests go to torch's CPU flash kernel:
attended alone, their R = Hq / Hkv query heads of each KV head are given as R query rows of one head,
so every K/V row is read once per KV head; their K/V is one strided view of the pool when their
slots are one run of consecutive slots, else one gather, the gathered ones of a pass in batches
(similar lengths, padded and masked: `batch_lone_decodes`); a group of decodes sharing pages reads
the shared runs once (one flash call with all members' query heads as query rows) and the members'
own tokens as one padded gather (one masked flash call), merged by log-sum-exp.

Longer extends go to torch's CPU flash-attention kernel (FlashAttention-2-style blocked online
softmax, GQA native), one call per part of a request's keys:
- its own new tokens: the pass's own k/v (strided views of the QKV output), causal;
- its cached prefix (tokens [0, prefix_len) in the pool), no mask (every query sees all of it): the
  runs of consecutive pool slots as views (at most MAX_VIEW_RUNS), else one `index_select` of the
  prefix's whole pages (`page_size` rows per copy).
The parts' outputs are merged by their log-sum-exps (`merge_attention`; the split-KV merge of
FlashDecoding, Dao et al. 2023, and of cascade inference).

The plain reference (`attention_torch.TorchAttnBackend`) stays the tests' oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from radixrt.attention.base import AttentionBackend, ForwardMeta, KVPool
from radixrt.worker import cpu_native

# A decode group must share at least this many tokens per extra member; below it the group's
# extra small ops cost more than the K/V reads they save.
MIN_SHARED_TOKENS = 64
# A decode group's shared runs and an extend's prefix runs are read as views, a few small ops each;
# past this many (a history written by interleaved decodes: one run per page) one gather costs less.
# A lone decode is read as a view only when it is one run (one flash-kernel call), else gathered.
MAX_VIEW_RUNS = 4

# Lone decodes of one pass are attended in batches of one flash-kernel call, their K/V one gather
# padded to the batch's longest (masked): a batch takes requests, longest first, while its padded
# rows stay within this factor of its real rows.
LONE_BATCH_PAD = 1.25

# With the native kernel, extends of at most this many new tokens go to it as well (their prefix one
# item of all their query rows, their new tokens one causal item of them); longer ones keep the torch
# flash kernel, whose blocked matmuls win when the causal part is large.
NATIVE_EXTEND_MAX = 64

Run = tuple[int, int]  # (first pool slot, tokens): K/V rows buf[slot : slot + tokens]


@dataclass(slots=True)
class _ReqPlan:
    """One extend request's share of a pass: its query rows [start, start + extend_len) of q attend
    the cached prefix (tokens [0, prefix_len) in the pool) and, causally, its own new tokens."""

    start: int
    extend_len: int
    prefix_len: int
    prefix_runs: list[Run]  # the prefix's runs of consecutive slots, read as views (prefix_pages None)
    prefix_pages: torch.Tensor | None  # [ceil(prefix_len / page_size)] int64 pages to gather, or None

    @property
    def from_new(self) -> bool:
        """No cached prefix: only the pass's own k/v."""
        return self.prefix_len == 0


@dataclass(slots=True)
class _DecodeGroup:
    """Decode requests attended together: their rows of q, the runs they share (read once for all
    of them) and each member's own runs after those (in position order).

    How the forward reads them (set by `_finish_group`): shared runs as views of the pool, or, when
    they are more than `MAX_VIEW_RUNS` (more than one for a group of one), as one gather of
    `shared_slots`; the members' own tokens
    (groups of two or more) as one padded gather of `own_slots`, `own_mask` hiding the padding."""

    q_rows: torch.Tensor  # [G] int64 rows of q, one per member
    shared: list[Run]
    own: list[list[Run]]  # [G] lists; all empty for a group of one (its runs are `shared`)
    shared_slots: torch.Tensor | None = None  # [S] int64 pool slots of the shared tokens, or None: views
    own_slots: torch.Tensor | None = None  # [G, N] int64 pool slots of each member's own tokens, padded
    own_mask: torch.Tensor | None = None  # [G, 1, 1, N] float32 0 / -inf (padding), None when unpadded


@dataclass(slots=True)
class _LoneBatch:
    """Lone decode requests attended by one flash-kernel call: q rows [B, Hkv, R, D], K/V one gather
    of `slots` ([B * S] int64, each request's slots padded to S with slot 0) viewed as [B, Hkv, S, D],
    `mask` [B, 1, 1, S] float32 0 / -inf hiding the padding (None when no request is padded)."""

    q_rows: torch.Tensor  # [B] int64
    slots: torch.Tensor  # [B * S] int64
    max_len: int  # S
    mask: torch.Tensor | None


def batch_lone_decodes(groups: list[_DecodeGroup]) -> tuple[list[_DecodeGroup], list[_LoneBatch]]:
    """Put the lone decodes that are gathered anyway (their slots in several runs) into batches for
    one gather and one flash call each (`LONE_BATCH_PAD`). Returns (the groups attended as before:
    real groups, lone decodes read as one view, and those left alone in their batch; the batches of
    two or more)."""
    kept = [g for g in groups if len(g.own) > 1 or g.shared_slots is None]
    lone = sorted((g for g in groups if len(g.own) == 1 and g.shared_slots is not None),
                  key=lambda g: -g.shared_slots.numel())  # a lone decode's slots: all its tokens
    lens_desc = [g.shared_slots.numel() for g in lone]
    batches: list[_LoneBatch] = []
    i = 0
    while i < len(lone):
        longest = lens_desc[i]
        j, total = i + 1, longest
        while j < len(lone) and (j - i + 1) * longest <= LONE_BATCH_PAD * (total + lens_desc[j]):
            total += lens_desc[j]
            j += 1
        members = lone[i:j]
        if len(members) == 1:
            kept.append(members[0])
        else:
            slots, mask = _padded_slots([g.shared_slots.numpy() for g in members])
            batches.append(_LoneBatch(q_rows=torch.cat([g.q_rows for g in members]),
                                      slots=torch.from_numpy(slots.reshape(-1)), max_len=longest, mask=mask))
        i = j
    return kept, batches


def attend_lone_batch(lb: _LoneBatch, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                      scale: float, o: torch.Tensor) -> None:
    """Lone decodes `lb` through one flash-kernel call (q [T, Hq, D], pool buffers [slots, Hkv, D]);
    written into o [T, Hq, D] at lb.q_rows. As `_attend_alone`, the R query heads of a KV head are
    R query rows of it."""
    b, hq, hkv, d = lb.q_rows.shape[0], q.shape[1], k_buf.shape[1], k_buf.shape[2]
    kk = k_buf.index_select(0, lb.slots).view(b, lb.max_len, hkv, d).transpose(1, 2)  # [B, Hkv, S, D]
    vv = v_buf.index_select(0, lb.slots).view(b, lb.max_len, hkv, d).transpose(1, 2)
    qb = q.index_select(0, lb.q_rows).to(k_buf.dtype).view(b, hkv, hq // hkv, d)  # [B, Hkv, R, D]
    mask = None if lb.mask is None else lb.mask.to(k_buf.dtype)
    ob, _ = flash_attention(qb, kk, vv, False, scale, mask)
    o.index_copy_(0, lb.q_rows, ob.reshape(b, hq, d).to(o.dtype))


def runs_of(row: np.ndarray, first_tok: int, end_tok: int, page_size: int) -> list[Run]:
    """The maximal runs of consecutive pool slots holding tokens [first_tok, end_tok) of a request
    with page-table row `row` (int32 pages); first_tok is a multiple of page_size."""
    p0, p1 = first_tok // page_size, -(-end_tok // page_size)
    pages = row[p0:p1].astype(np.int64)
    cuts = [0, *(np.flatnonzero(np.diff(pages) != 1) + 1).tolist(), len(pages)]
    out = []
    for i, j in zip(cuts[:-1], cuts[1:], strict=True):
        tokens = min(j * page_size, end_tok - first_tok) - i * page_size
        out.append((int(pages[i]) * page_size, tokens))
    return out


def slots_of(runs: list[Run]) -> np.ndarray:
    """The pool slots of `runs`, in order: [sum of tokens] int64."""
    return np.concatenate([np.arange(a, a + n, dtype=np.int64) for a, n in runs]) if runs else \
        np.zeros(0, dtype=np.int64)


def _finish_group(g: _DecodeGroup) -> _DecodeGroup:
    """Decide how the forward reads the group's K/V (see `_DecodeGroup`)."""
    if len(g.shared) > (MAX_VIEW_RUNS if len(g.own) > 1 else 1):
        g.shared_slots = torch.from_numpy(slots_of(g.shared))
    if len(g.own) > 1:
        slots, g.own_mask = _padded_slots([slots_of(runs) for runs in g.own])
        g.own_slots = torch.from_numpy(slots)
    return g


def _padded_slots(rows: list[np.ndarray]) -> tuple[np.ndarray, torch.Tensor | None]:
    """Slot lists of unequal lengths as one [G, N] int64 array padded with slot 0 (N the longest) and
    the additive float32 mask [G, 1, 1, N] (0 / -inf) hiding the padding; None when nothing is padded."""
    n = max(len(x) for x in rows)
    slots = np.zeros((len(rows), n), dtype=np.int64)  # padding reads slot 0, masked out
    for m, x in enumerate(rows):
        slots[m, :len(x)] = x
    if all(len(x) == n for x in rows):
        return slots, None
    pad = torch.from_numpy(np.arange(n)[None, :] >= np.array([len(x) for x in rows])[:, None])
    return slots, torch.zeros(len(rows), 1, 1, n).masked_fill_(pad[:, None, None, :], float("-inf"))


def _common_pages(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    eq = a[:n] == b[:n]
    return n if bool(eq.all()) else int(eq.argmin())


def decode_groups(rows: list[int], starts: list[int], seq_lens: list[int], table: np.ndarray,
                  page_size: int, finish: bool = True) -> list[_DecodeGroup]:
    """Group decode requests `rows` (batch indices) by shared leading pages; see the module docstring.

    Within a bucket of requests with the same first page, the members kept are the k requests with
    the most pages in common with the bucket's first that maximise (shared tokens) x (k - 1); the
    shared pages stop before every member's last token. The others attend alone. `finish` False
    leaves out how the torch path reads them (`_finish_group`): the native kernel takes the runs."""
    done = _finish_group if finish else (lambda g: g)
    buckets: dict[int, list[int]] = {}
    for b in rows:
        buckets.setdefault(int(table[b, 0]), []).append(b)
    groups = []
    for members in buckets.values():
        lead = members[0]
        common = sorted(((min(_common_pages(table[lead], table[b]), (seq_lens[b] - 1) // page_size), b)
                         for b in members), reverse=True)
        # the top k share common[k - 1] pages: keep the k that saves the most K/V reads
        best_k = max(range(1, len(common) + 1), key=lambda k: (common[k - 1][0] * (k - 1), k))
        best_pages = common[best_k - 1][0]
        if best_k < 2 or best_pages * page_size < MIN_SHARED_TOKENS:
            best_k = 0
        chosen = sorted(b for _, b in common[:best_k])
        if chosen:
            shared_end = best_pages * page_size
            groups.append(done(_DecodeGroup(
                q_rows=torch.tensor([starts[b] for b in chosen], dtype=torch.int64),
                shared=runs_of(table[lead], 0, shared_end, page_size),
                own=[runs_of(table[b], shared_end, seq_lens[b], page_size) for b in chosen])))
        for b in members:
            if b not in chosen:
                groups.append(done(_DecodeGroup(
                    q_rows=torch.tensor([starts[b]], dtype=torch.int64),
                    shared=runs_of(table[b], 0, seq_lens[b], page_size), own=[[]])))
    return groups


def _plan(start: int, ext: int, seq: int, row: np.ndarray, page_size: int) -> _ReqPlan:
    """Plan of one extend request from its lengths and page-table row (host int32 numpy)."""
    prefix = seq - ext
    if prefix == 0:
        return _ReqPlan(start, ext, 0, [], None)
    runs = runs_of(row, 0, prefix, page_size)
    if len(runs) <= MAX_VIEW_RUNS:
        return _ReqPlan(start, ext, prefix, runs, None)
    pages = torch.from_numpy(row[:-(-prefix // page_size)].astype(np.int64))
    return _ReqPlan(start, ext, prefix, runs, pages)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                    mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's CPU flash-attention kernel with its log-sum-exp: q [B, Hq, L, D], k/v [B, Hkv, S, D]
    (Hq a multiple of Hkv; strided views are fine) -> (o [B, Hq, L, D], lse [B, Hq, L] float32, the
    natural log of each query's sum of exp(scale * scores)). `causal`: top-left aligned (L == S).
    mask: additive, broadcastable to [B, Hq, L, S], q's dtype (e.g. 0 / -inf for padded keys)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask,
                                                                      scale=scale)


def merge_attention(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the union of two disjoint key sets from each set's output and log-sum-exp
    (o [..., L, D], lse [..., L]): weights exp(lse_i - lse), lse = logaddexp(lse1, lse2)."""
    lse = torch.logaddexp(lse1, lse2)
    w1, w2 = (lse1 - lse).exp_().unsqueeze(-1), (lse2 - lse).exp_().unsqueeze(-1)
    return (o1 * w1.to(o1.dtype)).addcmul_(o2, w2.to(o2.dtype)), lse


def _attend_alone(row: int, g: _DecodeGroup, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                  scale: float, o: torch.Tensor) -> None:
    """One decode request (q row `row` of q [T, Hq, D], K/V the runs `g.shared`) through torch's CPU
    flash kernel, written into o[row]. The R = Hq / Hkv query heads of each KV head are given as R
    query rows of one head ([1, Hkv, R, D], no mask), so every K/V row is read once per KV head, not
    once per query head; one run is a strided view of the pool, more runs one gather of their slots
    (`g.shared_slots`)."""
    hkv, d = k_buf.shape[1], k_buf.shape[2]
    qr = q[row].view(1, hkv, -1, d).to(k_buf.dtype)  # [1, Hkv, R, D]
    if g.shared_slots is None:
        (a, n), = g.shared
        kk, vv = k_buf[a:a + n], v_buf[a:a + n]
    else:
        kk, vv = k_buf.index_select(0, g.shared_slots), v_buf.index_select(0, g.shared_slots)
    ob, _ = flash_attention(qr, _bhsd(kk, kk.dtype), _bhsd(vv, vv.dtype), False, scale)
    o[row] = ob.view(-1, d)


def attend_decode_group(g: _DecodeGroup, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                        scale: float, o: torch.Tensor) -> None:
    """Attention of the group's members: q [T, Hq, D] (rows g.q_rows), pool buffers [slots, Hkv, D];
    written into o [T, Hq, D] at g.q_rows. Computed in the pool's dtype (float32 for an fp32 pool).

    Through torch's CPU flash kernel, one call per part of the keys, merged by log-sum-exp
    (`merge_attention`): the shared keys with every member's R query heads of a KV head as G*R query
    rows of it (`[1, Hkv, G*R, D]`, one call per run viewed from the pool, or one over the gathered
    `shared_slots`), then the members' own keys as one padded gather (`[G, Hkv, R, D]` against
    `[G, Hkv, N, D]`, `own_mask` hiding the padding). Every shared K/V row is read once per group."""
    n_members, hkv, d = len(g.own), k_buf.shape[1], k_buf.shape[2]
    if n_members == 1:
        return _attend_alone(int(g.q_rows[0]), g, q, k_buf, v_buf, scale, o)
    hq = q.shape[1]
    rep = hq // hkv
    qg = q.index_select(0, g.q_rows).to(k_buf.dtype).view(n_members, hkv, rep, d)  # [G, Hkv, R, D]
    if g.shared_slots is not None:  # many runs: one gather
        shared_kv = [(k_buf.index_select(0, g.shared_slots), v_buf.index_select(0, g.shared_slots))]
    else:
        shared_kv = [(k_buf[a:a + n], v_buf[a:a + n]) for a, n in g.shared]
    out = lse = None
    if shared_kv:
        qs = qg.transpose(0, 1).reshape(1, hkv, n_members * rep, d)  # [1, Hkv, G*R, D]
        for kk, vv in shared_kv:
            part = flash_attention(qs, _bhsd(kk, kk.dtype), _bhsd(vv, vv.dtype), False, scale)
            out, lse = part if out is None else merge_attention(out, lse, *part)
        out = out.reshape(hkv, n_members, rep, d).transpose(0, 1)  # [G, Hkv, R, D]
        lse = lse.reshape(hkv, n_members, rep).transpose(0, 1)  # [G, Hkv, R]
    if g.own_slots is not None:
        n_own, flat = g.own_slots.shape[1], g.own_slots.view(-1)
        ko = k_buf.index_select(0, flat).view(n_members, n_own, hkv, d).transpose(1, 2)  # [G, Hkv, N, D]
        vo = v_buf.index_select(0, flat).view(n_members, n_own, hkv, d).transpose(1, 2)
        mask = None if g.own_mask is None else g.own_mask.to(k_buf.dtype)
        part = flash_attention(qg, ko, vo, False, scale, mask)
        out, lse = part if out is None else merge_attention(out, lse, *part)
    o.index_copy_(0, g.q_rows, out.reshape(n_members, hq, d).to(o.dtype))


def native_plan(q_rows: list[int], groups: list[_DecodeGroup],
                extends: list[tuple[int, np.ndarray, np.ndarray]]) -> cpu_native.DecodePlan:
    """The native kernel's work for the rows `q_rows` of q: the decode rows grouped by `decode_groups`
    (per group its shared runs as one item attended by every member, and each member's own runs as
    one item; a lone decode: all its tokens, one item) and the short extends, each (first q row,
    prefix slots [P], new tokens' slots [L]): its prefix one item attended by all L query rows, and
    its new tokens one causal item of the L rows (new token i attends the new tokens 0..i)."""
    index = {r: i for i, r in enumerate(q_rows)}
    items: list[cpu_native.Item] = []
    for g in groups:
        rows = [index[r] for r in g.q_rows.tolist()]
        items.append((slots_of(g.shared), rows))
        if len(g.own) > 1:
            items.extend((slots_of(runs), [r]) for runs, r in zip(g.own, rows, strict=True))
    for start, prefix_slots, new_slots in extends:
        rows = [index[start + i] for i in range(len(new_slots))]
        if len(prefix_slots):
            items.append((prefix_slots, rows))
        items.append((new_slots, rows, True))
    return cpu_native.DecodePlan.build(q_rows, items)


def _bhsd(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[S, H, D] rows -> a [1, H, S, D] view (a copy only when the dtype differs)."""
    return rows.to(dtype).unsqueeze(0).transpose(1, 2)


class SdpaAttnBackend(AttentionBackend):
    """Implements attention.base.AttentionBackend on CPU: the native kernel for decodes and short
    extends, torch's CPU flash-attention kernel over the parts of each longer extend's keys, merged by
    log-sum-exp (module docstring).

    Args:
        pool: the paged K/V pool (k_buffers / v_buffers per layer, `[num_slots, Hkv, D]`).
        native: use the native kernel (None: when it builds and takes the pool's dtype and head_dim).

    `prepare` syncs with the host (it reads lengths and page-table rows), so this backend cannot be
    captured in a CUDA graph; it also runs on CUDA tensors but the worker uses it on CPU only.
    Exact against the reference up to fp32 rounding (tests/worker).
    """

    def __init__(self, pool: KVPool, native: bool | None = None) -> None:
        self.pool = pool
        self.meta: ForwardMeta | None = None
        self.plans: list[_ReqPlan] = []  # extend requests
        self.groups: list[_DecodeGroup] = []  # decode requests (but the batched lone ones)
        self.lone_batches: list[_LoneBatch] = []  # lone decode requests attended together
        # decodes through the native kernel (radixrt/worker/cpu_native.py) when it loads and takes the
        # pool; None: decide from the machine (RADIXRT_CPU_NATIVE=0 turns it off)
        if native is None:
            native = cpu_native.supports(pool.k_buffers[0]) and cpu_native.load() is not None
        self.native = native
        self.native_plan: cpu_native.DecodePlan | None = None

    def prepare(self, meta: ForwardMeta) -> None:
        """Plan each request of the pass (where its K/V lives); see the module docstring."""
        self.meta = meta
        seq_lens = meta.seq_lens.tolist()
        ext_lens = meta.extend_lens.tolist()
        starts = meta.extend_start_loc.tolist()
        max_pages = -(-max(seq_lens, default=0) // meta.page_size)
        table = meta.page_table[:, :max_pages].cpu().numpy()  # [B, used pages] int32
        decode = [b for b, e in enumerate(ext_lens) if e == 1 and seq_lens[b] > 1]
        is_decode = set(decode)
        short = set() if not self.native else \
            {b for b, e in enumerate(ext_lens) if b not in is_decode and e <= NATIVE_EXTEND_MAX}
        self.plans = [_plan(starts[b], ext_lens[b], seq_lens[b], table[b], meta.page_size)
                      for b in range(len(seq_lens)) if b not in is_decode and b not in short]
        self.native_plan = None
        if not self.native:
            self.groups, self.lone_batches = batch_lone_decodes(
                decode_groups(decode, starts, seq_lens, table, meta.page_size))
            return
        self.groups, self.lone_batches = [], []
        if decode or short:
            loc = meta.out_cache_loc.numpy().astype(np.int64, copy=False)
            extends = [(starts[b], slots_of(runs_of(table[b], 0, seq_lens[b] - ext_lens[b], meta.page_size))
                        if seq_lens[b] > ext_lens[b] else np.zeros(0, dtype=np.int64),
                        loc[starts[b]:starts[b] + ext_lens[b]]) for b in sorted(short)]
            q_rows = [starts[b] for b in decode]
            q_rows += [starts[b] + i for b in sorted(short) for i in range(ext_lens[b])]
            self.native_plan = native_plan(
                q_rows, decode_groups(decode, starts, seq_lens, table, meta.page_size, finish=False), extends)

    def _prefix_kv(self, k_buf: torch.Tensor, v_buf: torch.Tensor, p: _ReqPlan, dtype: torch.dtype
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The cached prefix of request `p` as (K, V) parts [1, Hkv, n, D] in `dtype`: one view per
        run, or one gather of its whole pages."""
        if p.prefix_pages is None:
            return [(_bhsd(k_buf[a:a + n], dtype), _bhsd(v_buf[a:a + n], dtype)) for a, n in p.prefix_runs]
        ps, hkv, d = self.meta.page_size, k_buf.shape[1], k_buf.shape[2]
        parts = []
        for buf in (k_buf, v_buf):
            rows = buf.view(-1, ps * hkv * d).index_select(0, p.prefix_pages)  # [pages, ps * Hkv * D]
            parts.append(_bhsd(rows.view(-1, hkv, d)[:p.prefix_len], dtype))
        return [tuple(parts)]

    def _attend_extend(self, p: _ReqPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       k_buf: torch.Tensor, v_buf: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention of extend request `p` (module docstring) -> [1, Hq, extend_len, D]."""
        rows = slice(p.start, p.start + p.extend_len)
        qb = q[rows].unsqueeze(0).transpose(1, 2)  # [1, Hq, L, D]
        own_k, own_v = _bhsd(k[rows], q.dtype), _bhsd(v[rows], q.dtype)
        causal = p.extend_len > 1
        if p.from_new:
            return F.scaled_dot_product_attention(qb, own_k, own_v, is_causal=causal, scale=scale,
                                                  enable_gqa=True)
        ob, lse = flash_attention(qb, own_k, own_v, causal, scale)
        for kk, vv in self._prefix_kv(k_buf, v_buf, p, q.dtype):
            ob, lse = merge_attention(ob, lse, *flash_attention(qb, kk, vv, False, scale))
        return ob

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                scale: float) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> o [T, Hq, D]; stores k/v at meta.out_cache_loc first."""
        meta = self.meta
        k_buf, v_buf = self.pool.k_buffers[layer_id], self.pool.v_buffers[layer_id]
        if not (self.native and cpu_native.store_kv(k_buf, v_buf, k, v, meta.out_cache_loc)):
            k_buf.index_copy_(0, meta.out_cache_loc, k.to(k_buf.dtype))
            v_buf.index_copy_(0, meta.out_cache_loc, v.to(v_buf.dtype))
        plan = self.native_plan
        if (plan is not None and plan.all_rows and q.shape[0] == plan.q_rows.numel()
                and q.dtype == torch.float32):
            # every row through the native kernel, in order: it reads q in place and writes o
            return cpu_native.decode_attention(q, k_buf, v_buf, plan, scale,
                                               out=torch.empty(q.shape, dtype=torch.float32))
        o = torch.empty_like(q)
        for p in self.plans:
            ob = self._attend_extend(p, q, k, v, k_buf, v_buf, scale)  # [1, Hq, L, D]
            o[p.start:p.start + p.extend_len] = ob[0].transpose(0, 1)
        if self.native_plan is not None:
            out = cpu_native.decode_attention(q, k_buf, v_buf, self.native_plan, scale)
            o.index_copy_(0, self.native_plan.q_rows, out.to(o.dtype))
        for g in self.groups:
            attend_decode_group(g, q, k_buf, v_buf, scale, o)
        for lb in self.lone_batches:
            attend_lone_batch(lb, q, k_buf, v_buf, scale, o)
        return o
