"""Per-request grammar state: the next-token bitmask, token acceptance, and exact rollback.

Ownership: the scheduler process holds one `RequestMatcher` per constrained request. Each step,
after the token of the previous pass has been accepted, it fills the request's row of the batch
bitmask (`fill_bitmask`, or `BitmaskFiller.fill` for the whole batch on several threads); the
worker applies the rows to the logits before sampling. A pass's mask depends on the token sampled
in the pass before, so a constrained request's mask for pass N+1 can be filled only once pass N's
token is known and accepted (overlap scheduling can fill the other requests' rows, not this one).

Bitmask layout (xgrammar's): int32 [num_rows, ceil(vocab_size / 32)]; bit j % 32 of word j // 32 is
1 when token j is allowed. Rows are filled in place; the array must be C-contiguous on the CPU
(numpy or torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class RequestMatcher:
    """The grammar state of one request (wraps xgrammar.GrammarMatcher).

    num_accepted counts the tokens accepted so far, the stop token included; rollback(n) undoes
    the last n of them exactly (xgrammar keeps the whole history), so a retracted request can be
    set back to the output it keeps with rollback_to(num_kept).
    """

    __slots__ = ("_matcher", "num_accepted", "_stop_token_ids", "_vocab_size")

    def __init__(self, compiled_grammar: Any) -> None:
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled_grammar)
        self._stop_token_ids = list(self._matcher.stop_token_ids)
        self._vocab_size = int(compiled_grammar.tokenizer_info.vocab_size)
        self.num_accepted = 0

    def admits_any_token(self) -> bool:
        """Whether some token may come next (the stop token included): False when the grammar is at
        a dead end, e.g. one whose language is empty (`root ::= root`, the regex `[^\\s\\S]`)."""
        from .bitmask import allocate_bitmask

        mask = allocate_bitmask(1, self._vocab_size)
        self.fill_bitmask(mask, 0)
        return bool(mask.any())

    @property
    def is_terminated(self) -> bool:
        """True once the stop token was accepted: the request ends with finish_reason "stop"."""
        return self._matcher.is_terminated()

    @property
    def is_completed(self) -> bool:
        """True when the output so far is a complete sentence of the grammar (only stop may follow
        or the grammar may go on); unlike is_terminated, no stop token is needed."""
        return self._matcher.is_completed()

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self._stop_token_ids)

    def fill_bitmask(self, bitmask: Any, row: int) -> bool:
        """Write the allowed-next-token bits into bitmask[row] (int32 [R, W], CPU). A terminated
        matcher writes a row that allows only its stop tokens. Returns False when the row allows
        every token (no masking needed). Does not change the state."""
        if self._matcher.is_terminated():
            bitmask[row] = 0
            for tok in self._stop_token_ids:
                bitmask[row, tok // 32] |= _bit(tok % 32)
            return True
        return bool(self._matcher.fill_next_token_bitmask(bitmask, row))

    def accept_token(self, token_id: int) -> bool:
        """Advance by one sampled token. False (state unchanged) when the grammar rejects it, the
        id is out of range or special, or the matcher has already terminated."""
        ok = bool(self._matcher.accept_token(int(token_id)))
        if ok:
            self.num_accepted += 1
        return ok

    def accept_tokens(self, token_ids: Sequence[int]) -> int:
        """Accept tokens in order until one is rejected; returns how many were accepted."""
        for i, tok in enumerate(token_ids):
            if not self.accept_token(tok):
                return i
        return len(token_ids)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted tokens. Raises ValueError if num_tokens is negative or
        more than were accepted."""
        if num_tokens < 0 or num_tokens > self.num_accepted:
            raise ValueError(f"cannot roll back {num_tokens} tokens: {self.num_accepted} accepted")
        if num_tokens:
            self._matcher.rollback(num_tokens)
            self.num_accepted -= num_tokens

    def rollback_to(self, num_accepted: int) -> None:
        """Set the state back to just after the first num_accepted accepted tokens."""
        self.rollback(self.num_accepted - num_accepted)

    def reset(self) -> None:
        """Back to the start state (nothing accepted)."""
        self._matcher.reset()
        self.num_accepted = 0


def _bit(i: int) -> int:
    """The int32 value with only bit i set (bit 31 is the sign bit)."""
    return (1 << i) - (1 << 32) if i == 31 else 1 << i


class BitmaskFiller:
    """Fills the bitmask rows of many matchers for one step.

    Used by the scheduler each step for the batch's constrained requests: row i of `bitmask`
    receives matchers[i]'s mask. From `min_rows_for_threads` live matchers on, the rows are filled
    on xgrammar's native threads; below it one by one, since the thread hand-off costs more than a
    few rows (bench/grammar_compile.py: ~5-13 us per row serially for JSON, ~50-500 us per row
    through the threads on a busy 2-core machine at 8 rows). Terminated matchers get stop-only rows.
    """

    def __init__(self, num_threads: int = 2, min_rows_for_threads: int = 64) -> None:
        import xgrammar as xgr

        self._batch = xgr.BatchGrammarMatcher(max_threads=num_threads)
        self.min_rows_for_threads = min_rows_for_threads

    def fill(self, matchers: Sequence[RequestMatcher], bitmask: Any) -> None:
        """bitmask: int32 [>= len(matchers), W] on the CPU; rows [0, len(matchers)) are written."""
        live = []
        for i, m in enumerate(matchers):
            if m.is_terminated or len(matchers) < self.min_rows_for_threads:
                m.fill_bitmask(bitmask, i)
            else:
                live.append(i)
        if live:
            self._batch.batch_fill_next_token_bitmask([matchers[i]._matcher for i in live], bitmask, live)
