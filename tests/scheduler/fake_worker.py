"""A model-free worker for scheduler tests: it checks the KV the scheduler says exists.

It keeps the worker's page table (req_to_page) and a slot -> token map standing in for the KV pool.
For every request in a pass it writes the new tokens' "KV" (their token ids) into their slots, then
reads the request's whole sequence back through the page table and compares it with the tokens the
scheduler sent plus what it wrote earlier: a wrong page, a missed copy-on-write or a page reused
while still referenced shows up as a mismatch. The next token is a hash of the sequence read back,
so a request's output depends on its whole context, as with a real model.
"""

from __future__ import annotations

import numpy as np

from radixrt.memory.radix_cache import RadixCache
from radixrt.protocol import ForwardBatch, ForwardMode, ForwardResult, GrammarMask


class KVMismatch(AssertionError):
    pass


class FakeWorker:
    def __init__(self, num_pages: int, page_size: int, max_rows: int, max_pages_per_req: int,
                 vocab_size: int) -> None:
        self.page_size = page_size
        self.vocab_size = vocab_size
        self.req_to_page = np.zeros((max_rows, max_pages_per_req), np.int64)
        self.slots = np.full(num_pages * page_size, -1, np.int64)
        self.num_passes = 0
        self.num_cascade_passes = 0
        self.cascade_grouped_rows: set[int] = set()
        self.last_out = np.zeros(0, np.int64)
        self.grammar_rows_seen: list[list[int]] = []  # constrained rows of every pass (deferred too)
        self.deferred_rows_seen: list[list[int]] = []  # fb.grammar_deferred of every pass

    def next_token(self, seq: list[int]) -> int:
        h = 1469598103934665603
        for t in seq[-64:]:
            h = ((h ^ t) * 1099511628211) & 0xFFFFFFFFFFFF
        return int((h ^ len(seq)) % self.vocab_size)

    def forward(self, fb: ForwardBatch, expected: dict[int, list[int]] | None = None,
                mask: GrammarMask | None = None) -> ForwardResult:
        """Run a pass. `expected` (row -> full known token list) enables the content check; `mask`
        carries the pass's deferred grammar rows (required when fb.grammar_deferred is set)."""
        self.num_passes += 1
        self.req_to_page[fb.upd_rows, fb.upd_cols] = fb.upd_pages
        ps = self.page_size
        for s, d in zip(fb.cow_src, fb.cow_dst, strict=True):
            self.slots[d * ps:(d + 1) * ps] = self.slots[s * ps:(s + 1) * ps]
        input_ids = np.asarray(fb.input_ids, np.int64).copy()
        input_ids[fb.prev_token_pos] = self.last_out[fb.prev_token_src]  # overlap: in-flight inputs
        self.slots[fb.out_cache_loc] = input_ids
        fill = self._in_flight_fill(fb)
        out = []
        start = 0
        for i, row in enumerate(fb.req_rows):
            seq_len = int(fb.seq_lens[i])
            ext = int(fb.extend_lens[i])
            pos = np.arange(seq_len)
            slot = self.req_to_page[row, pos // ps] * ps + pos % ps
            seq = self.slots[slot].tolist()
            want = (None if expected is None
                    else self.resolve(expected[int(row)][:seq_len], fill.get(int(row))))
            if want is not None and seq != want:
                bad = next(j for j, (a, b) in enumerate(zip(seq, want, strict=False)) if a != b)
                raise KVMismatch(f"row {row}: KV at position {bad} holds {seq[bad]}, expected {want[bad]}")
            new_slots = fb.out_cache_loc[start:start + ext]
            if not np.array_equal(new_slots, slot[seq_len - ext:]):
                raise KVMismatch(f"row {row}: out_cache_loc disagrees with the page table")
            start += ext
            out.append(self.next_token(seq))
        if len(fb.cascade_starts):
            self._check_cascade(fb, expected, fill)
        self._apply_grammar(fb, out, mask)
        self.last_out = np.array(out, np.int64)
        return ForwardResult(batch_id=fb.batch_id, next_token_ids=np.array(out, np.int32))

    def _apply_grammar(self, fb: ForwardBatch, out: list[int], mask: GrammarMask | None) -> None:
        """Constrained rows sample among their allowed tokens (bit j of the row's bitmask): the
        allowed token at (hash % number allowed), so the choice still depends on the context.
        Deferred rows come from `mask` (worker/forward_pass.grammar_rows checks and joins them)."""
        from radixrt.worker.forward_pass import grammar_rows

        rows_arr, masks = grammar_rows(fb, mask)
        rows = rows_arr.tolist()
        self.grammar_rows_seen.append(rows)
        self.deferred_rows_seen.append(fb.grammar_deferred.tolist())
        if not rows:
            return
        for r, i in enumerate(rows):
            bits = np.unpackbits(masks[r].view(np.uint8), bitorder="little")[:self.vocab_size]
            allowed = np.flatnonzero(bits)
            assert len(allowed), f"request {i}: the bitmask allows no token"
            out[i] = int(allowed[out[i] % len(allowed)])

    def _check_cascade(self, fb: ForwardBatch, expected: dict[int, list[int]] | None,
                       fill: dict[int, dict[int, int]]) -> None:
        """What the cascade kernel relies on: each group's prefix, read through its FIRST member's
        page-table row, is every member's own KV for those positions (whole pages, before the new token)."""
        if fb.mode != int(ForwardMode.DECODE):
            raise KVMismatch("cascade groups in a pass that is not DECODE")
        members = fb.cascade_members.tolist()
        if len(set(members)) != len(members) or fb.cascade_starts[-1] != len(members):
            raise KVMismatch(f"bad cascade members {members} / starts {fb.cascade_starts.tolist()}")
        ps = self.page_size
        self.num_cascade_passes += 1
        for g, prefix in enumerate(fb.cascade_prefix_lens.tolist()):
            group = members[fb.cascade_starts[g]:fb.cascade_starts[g + 1]]
            leader_row = int(fb.req_rows[group[0]])
            if prefix <= 0 or prefix % ps or len(group) < 2:
                raise KVMismatch(f"group {g}: prefix {prefix} / size {len(group)}")
            pages = prefix // ps
            for b in group:
                row = int(fb.req_rows[b])
                if prefix >= int(fb.seq_lens[b]):
                    raise KVMismatch(f"group {g}: prefix {prefix} covers request {b}'s new token")
                if not np.array_equal(self.req_to_page[row, :pages], self.req_to_page[leader_row, :pages]):
                    raise KVMismatch(f"group {g}: request {b} does not share the prefix pages")
                if expected is not None:
                    pos = np.arange(prefix)
                    got = self.slots[self.req_to_page[leader_row, pos // ps] * ps + pos % ps]
                    want = self.resolve(expected[row][:prefix], fill.get(row))
                    if got.tolist() != want:
                        raise KVMismatch(f"group {g}: the shared prefix is not request {b}'s KV")
            self.cascade_grouped_rows.update(int(fb.req_rows[b]) for b in group)

    def _in_flight_fill(self, fb: ForwardBatch) -> dict[int, dict[int, int]]:
        """row -> {position: token} of the pass's in-flight inputs (prev_token_pos / prev_token_src),
        read from the previous pass's output; call before last_out is replaced."""
        if not len(fb.prev_token_pos):
            return {}
        req_of_token = np.repeat(np.arange(len(fb.req_rows)), fb.extend_lens)
        fill: dict[int, dict[int, int]] = {}
        for t, src in zip(fb.prev_token_pos.tolist(), fb.prev_token_src.tolist(), strict=True):
            row = int(fb.req_rows[req_of_token[t]])
            fill.setdefault(row, {})[int(fb.positions[t])] = int(self.last_out[src])
        return fill

    @staticmethod
    def resolve(ids: list[int], fill: dict[int, int] | None) -> list[int]:
        """A request's known tokens as the scheduler holds them (in-flight ones as a stand-in), with
        the in-flight ones replaced by the tokens the previous pass sampled."""
        ids = list(ids)
        for pos, tok in (fill or {}).items():
            if pos < len(ids):
                ids[pos] = tok
        return ids

    def check_tree(self, cache: RadixCache) -> None:
        """Every token of the radix tree is the KV its page holds: no stand-in for a token in
        flight (or anything else not computed) was ever published."""
        ps = self.page_size
        for node in cache.iter_nodes():
            if not node.key:
                continue
            pos = np.arange(node.start, node.end)
            pages = np.asarray(node.pages, np.int64)[pos // ps - node.start // ps]
            held = self.slots[pages * ps + pos % ps]
            if held.tolist() != list(node.key):
                bad = int(np.flatnonzero(held != np.asarray(node.key))[0])
                raise KVMismatch(f"tree node at {node.start}: position {node.start + bad} is keyed "
                                 f"{node.key[bad]} but its page holds {held[bad]}")
