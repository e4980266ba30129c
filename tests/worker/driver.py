"""A minimal stand-in for the scheduler: drives a ModelRunner with real ForwardBatches.

Pages are handed out sequentially (page 0 stays reserved), every request gets its own req_to_page
row, prompts are prefilled in chunks of at most `chunk` tokens, and requests that finished their
prompt decode in the same passes as others' chunks (MIXED), so EXTEND, MIXED and DECODE passes and
prefixes ending inside a page are all exercised.
"""

from __future__ import annotations

import math

import numpy as np

from radixrt.protocol import ForwardBatch, ForwardMode
from radixrt.worker.model_runner import ModelRunner


def _i32(x: list[int]) -> np.ndarray:
    return np.asarray(x, dtype=np.int32)


class GreedyDriver:
    """Runs prompts to `max_new` greedy tokens each, all requests batched together."""

    def __init__(self, runner: ModelRunner, chunk: int = 1 << 30) -> None:
        self.runner = runner
        self.chunk = chunk
        self.next_page = 1
        self.batch_id = 0

    def _alloc(self, total_len: int) -> list[int]:
        n = math.ceil(total_len / self.runner.page_size)
        pages = list(range(self.next_page, self.next_page + n))
        self.next_page += n
        assert self.next_page <= self.runner.pool.num_pages, "test pool too small"
        return pages

    def generate(self, prompts: list[list[int]], max_new: int, temperature: float = 0.0,
                 seeds: list[int] | None = None) -> list[list[int]]:
        ps = self.runner.page_size
        self.req_pages = [self._alloc(len(p) + max_new) for p in prompts]
        upd = [(r, c, pg) for r, pl in enumerate(self.req_pages) for c, pg in enumerate(pl)]
        done = [0] * len(prompts)  # tokens whose KV exists
        outs: list[list[int]] = [[] for _ in prompts]
        first = True
        while any(len(o) < max_new for o in outs):
            rows, ids, lens, sampled = [], [], [], []
            for r, p in enumerate(prompts):
                if len(outs[r]) >= max_new:
                    continue
                if done[r] < len(p):
                    new = p[done[r]:done[r] + self.chunk]
                else:
                    new = [outs[r][-1]]
                rows.append(r)
                ids.append(new)
                lens.append(len(new))
                sampled.append(done[r] + len(new) >= len(p))
            b = self._batch(rows, ids, done, upd if first else [], ps, temperature, seeds,
                            [len(outs[r]) for r in rows])
            first = False
            res = self.runner.forward(b)
            for r, n, tok, s in zip(rows, lens, res.next_token_ids.tolist(), sampled, strict=True):
                done[r] += n
                if s:
                    outs[r].append(int(tok))
        return outs

    def _batch(self, rows: list[int], ids: list[list[int]], done: list[int], upd: list[tuple[int, int, int]],
               ps: int, temperature: float, seeds: list[int] | None, steps: list[int]) -> ForwardBatch:
        pos, loc = [], []
        for r, new in zip(rows, ids, strict=True):
            pages = self.req_pages[r]
            for j in range(len(new)):
                p = done[r] + j
                pos.append(p)
                loc.append(pages[p // ps] * ps + p % ps)
        ext = [len(x) for x in ids]
        is_decode = [done[r] > 0 and e == 1 for r, e in zip(rows, ext, strict=True)]
        mode = ForwardMode.DECODE if all(is_decode) else (
            ForwardMode.EXTEND if not any(is_decode) else ForwardMode.MIXED)
        b = len(rows)
        self.batch_id += 1
        return ForwardBatch(
            batch_id=self.batch_id, mode=int(mode), req_rows=_i32(rows),
            input_ids=_i32([t for x in ids for t in x]), positions=_i32(pos), out_cache_loc=_i32(loc),
            seq_lens=_i32([done[r] + e for r, e in zip(rows, ext, strict=True)]), extend_lens=_i32(ext),
            upd_rows=_i32([u[0] for u in upd]), upd_cols=_i32([u[1] for u in upd]),
            upd_pages=_i32([u[2] for u in upd]),
            temperature=np.full(b, temperature, np.float32), top_p=np.ones(b, np.float32),
            top_k=np.full(b, -1, np.int32), min_p=np.zeros(b, np.float32),
            seeds=_i32([(seeds or [0] * (max(rows) + 1))[r] for r in rows]), sample_steps=_i32(steps),
        )


def single_request_batch(ids: list[int], start: int = 0, page_size: int = 4, row: int = 0,
                         batch_id: int = 1) -> ForwardBatch:
    """One request at req row `row` whose pages are 1, 2, 3, ... in order: tokens `ids` at positions
    start.. (EXTEND, or DECODE for one token after a prefix). Page-table writes cover every page."""
    n = len(ids)
    end = start + n
    pages = np.arange(1, math.ceil(end / page_size) + 1, dtype=np.int32)
    pos = np.arange(start, end, dtype=np.int32)
    mode = ForwardMode.DECODE if (n == 1 and start > 0) else ForwardMode.EXTEND
    return ForwardBatch(
        batch_id=batch_id, mode=int(mode), req_rows=_i32([row]), input_ids=_i32(ids), positions=pos,
        out_cache_loc=(pages[pos // page_size] * page_size + pos % page_size).astype(np.int32),
        seq_lens=_i32([end]), extend_lens=_i32([n]), upd_rows=np.full(len(pages), row, np.int32),
        upd_cols=np.arange(len(pages), dtype=np.int32), upd_pages=pages,
        temperature=np.zeros(1, np.float32), top_p=np.ones(1, np.float32), top_k=_i32([-1]),
        min_p=np.zeros(1, np.float32), seeds=_i32([0]), sample_steps=_i32([0]))
