"""Find the groups of a decode pass whose requests share prefix pages, for cascade attention.

Requests admitted with the same cached prefix (a shared system prompt, the same conversation
history, the n samples of one prompt) point at the same physical KV pages for it (radix cache,
memory/). Reading those pages once per group rather than once per request is the idea of cascade
inference (FlashInfer, Ye et al. 2024) and Hydragen (Juravsky et al. 2024); the kernel is
`radixrt.kernels.cascade_decode_attention`, the metadata `protocol.ForwardBatch.cascade_*`.

Grouping, per pass, on the host: requests are bucketed by their first page; within a bucket each
request's common page prefix with the bucket's first request is computed once per (leader, member)
pair and cached on the member (page lists only grow while a request runs, so it stays valid until
either is retracted), then capped to the full pages before the request's new token. The group's
prefix length P maximises the tokens saved, P x (members with at least P common pages - 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from radixrt.scheduler.batch import ScheduledItem

# A cascade pass launches two more kernels per layer (and runs eagerly beyond the cascade CUDA
# graphs' sizes and group count), so it pays only when it saves reading a fair amount of KV: 16K
# tokens are ~0.9 GB for a 7B model.
DEFAULT_MIN_SAVED_TOKENS = 16384


def _common_pages(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two page lists: list compares of runs of _RUN pages, then
    page by page within the first run that differs."""
    n = min(len(a), len(b))
    i = 0
    while i + _RUN <= n and a[i:i + _RUN] == b[i:i + _RUN]:
        i += _RUN
    stop = min(i + _RUN, n)
    while i < stop and a[i] == b[i]:
        i += 1
    return i


_RUN = 32


def find_cascade_groups(items: Sequence[ScheduledItem], page_size: int, min_saved_tokens: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(members int32 [M], starts int32 [G+1], prefix_lens int32 [G]) for a DECODE pass, or None
    when grouping would save fewer than `min_saved_tokens` KV token reads per layer and KV head.

    items: the pass's requests (extend_len 1 each), in batch order; member indices refer to it.
    """
    first: dict[int, int] = {}  # first page -> index of its first request (bucket order)
    buckets: dict[int, list[int]] = {}  # first page -> indices, for pages shared by two or more
    for i, it in enumerate(items):
        kv = it.req.kv
        if kv is not None and it.start >= page_size and kv.pages:
            page = kv.pages[0]
            j = first.setdefault(page, i)
            if j != i:  # no list for the (usual) request alone in its bucket
                if (idx := buckets.get(page)) is None:
                    buckets[page] = [j, i]
                else:
                    idx.append(i)
    members: list[int] = []
    starts = [0]
    prefix_lens: list[int] = []
    saved = 0
    for page in first:
        idx = buckets.get(page)
        if idx is None:
            continue
        leader = items[idx[0]].req
        common = []
        for i in idx:
            it = items[i]
            req = it.req
            key = (leader.kv, req.kv)
            cached = req.cascade_key
            if cached is None or cached[0] is not key[0] or cached[1] is not key[1]:
                req.cascade_key = key
                req.cascade_common = _common_pages(leader.kv.pages, req.kv.pages)
            common.append(min(req.cascade_common, it.start // page_size))
        best_pages, best_gain = 0, 0
        for p in set(common):
            gain = p * (sum(c >= p for c in common) - 1)
            if gain > best_gain:
                best_pages, best_gain = p, gain
        if best_gain == 0:
            continue
        group = [i for i, c in zip(idx, common, strict=True) if c >= best_pages]
        members.extend(group)
        starts.append(len(members))
        prefix_lens.append(best_pages * page_size)
        saved += best_gain * page_size
    if saved < max(1, min_saved_tokens):
        return None
    return np.array(members, np.int32), np.array(starts, np.int32), np.array(prefix_lens, np.int32)
