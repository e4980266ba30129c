"""Per-request state on the tokenizer side: one HTTP request = one RequestHandle = one or more samples.

Each sample (one choice: one prompt x one of n) is one GenerateReq with its own rid; all samples of a
request share one `Inbox` fed by TokenizerManager. The handle reads everything pending at once and
yields one batch of events per wake-up, with one merged event per sample (text, token ids and logprobs
of all its new tokens), so that a request that is behind catches up with one SSE write, not one per
token. A sample turns token chunks into text with an IncrementalDetokenizer and a StopMatcher; a
stop-string match finishes the sample ("stop") and sends AbortReq so that the scheduler frees its pages.
Leaving the handle (normally, on error, or because the client went away and the task was cancelled)
aborts every sample that has not finished.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from radixrt import protocol

from .detokenizer import IncrementalDetokenizer
from .errors import APIError, from_scheduler_error
from .manager import Inbox, TokenChunk, TokenizerManager
from .stop import StopMatcher
from .token_ids import ids_array


@dataclass(slots=True)
class TokenLogprob:
    """Log-probability of one sampled token and, if asked, its top alternatives [(id, logprob)]."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class SampleSpec:
    """What to generate for one choice."""

    index: int
    input_ids: list[int]
    sampling: dict[str, Any]
    stop: list[str]
    skip_special_tokens: bool = True
    grammar_kind: str | None = None  # the output constraint, validated (GenerateReq.grammar_kind)
    grammar_text: str = ""
    cache_salt: str | None = None  # the prefix cache's tenant namespace


@dataclass(slots=True)
class SampleEvent:
    """New output of one sample: text safe to show, the tokens consumed, and the finish state."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob]
    finish_reason: str | None
    matched_stop: Any
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class SampleState:
    """Text state of one sample. Tokens after a stop-string match are ignored."""

    def __init__(self, rid: str, spec: SampleSpec, tokenizer: Any) -> None:
        self.rid = rid
        self.spec = spec
        self.detok = IncrementalDetokenizer(tokenizer, spec.skip_special_tokens)
        self.stop = StopMatcher(spec.stop)
        self.finished = False
        self.error: str | None = None  # the scheduler's rejection (or the 408), when it ended that way
        self.finish_reason: str | None = None
        self.matched_stop: Any = None
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.pending_lp: list[TokenLogprob] = []
        self.pending_ids: list[int] = []  # consumed, not yet reported in an event

    def consume(self, chunk: TokenChunk) -> SampleEvent | None:
        """Apply one chunk; return an event when there is text to emit or the sample finished.

        Raises:
            APIError: the scheduler rejected the request (chunk.error).
        """
        if chunk.error:
            self.finished, self.error = True, chunk.error
            raise from_scheduler_error(chunk.error)
        if chunk.cached_tokens is not None:
            self.cached_tokens = int(chunk.cached_tokens)
        ids_new = chunk.ids
        if not self.stop.stops and chunk.logprobs is None:  # fast path: the whole chunk at once
            self.pending_ids.extend(ids_new)
            self.completion_tokens += len(ids_new)
            text = self.detok.add(ids_new) if ids_new else ""
            if chunk.finish_reason is not None:
                text += self.detok.flush()
                self.finish_reason, self.matched_stop = chunk.finish_reason, chunk.matched_stop
                self.finished = True
            elif not text:
                return None
            return self._event(text)
        text_parts: list[str] = []
        for j, tok in enumerate(ids_new):
            self.pending_ids.append(tok)
            self.completion_tokens += 1
            if chunk.logprobs is not None:
                self.pending_lp.append(_token_logprob(chunk, j, tok))
            text_parts.append(self.stop.feed(self.detok.add([tok])))
            if self.stop.matched is not None:
                self.finished = True
                self.finish_reason = "stop"
                self.matched_stop = self.stop.matched
                break
        if not self.finished and chunk.finish_reason is not None:
            text_parts.append(self.stop.feed(self.detok.flush()))
            if self.stop.matched is not None:
                self.finish_reason, self.matched_stop = "stop", self.stop.matched
            else:
                text_parts.append(self.stop.flush())
                self.finish_reason, self.matched_stop = chunk.finish_reason, chunk.matched_stop
            self.finished = True
        text = "".join(text_parts)
        if not text and not self.finished:
            return None
        return self._event(text)

    def _event(self, text: str) -> SampleEvent:
        lps, self.pending_lp = self.pending_lp, []
        ids, self.pending_ids = self.pending_ids, []
        return SampleEvent(index=self.spec.index, text=text, token_ids=ids, logprobs=lps,
                           finish_reason=self.finish_reason if self.finished else None,
                           matched_stop=self.matched_stop, prompt_tokens=len(self.spec.input_ids),
                           completion_tokens=self.completion_tokens, cached_tokens=self.cached_tokens)


def _token_logprob(chunk: TokenChunk, j: int, tok: int) -> TokenLogprob:
    assert chunk.logprobs is not None
    top: list[tuple[int, float]] = []
    if chunk.top_ids is not None and chunk.top_logprobs is not None:
        top = list(zip(chunk.top_ids[j].tolist(), chunk.top_logprobs[j].tolist(), strict=True))
    return TokenLogprob(token_id=tok, logprob=float(chunk.logprobs[j]), top=top)


def _merge(a: SampleEvent, b: SampleEvent) -> SampleEvent:
    """One event for two consecutive events of the same sample."""
    return SampleEvent(index=b.index, text=a.text + b.text, token_ids=a.token_ids + b.token_ids,
                       logprobs=a.logprobs + b.logprobs, finish_reason=b.finish_reason,
                       matched_stop=b.matched_stop, prompt_tokens=b.prompt_tokens,
                       completion_tokens=b.completion_tokens, cached_tokens=b.cached_tokens)


@dataclass(slots=True)
class Timing:
    """Wall-clock marks of one request (seconds, time.perf_counter)."""

    start_s: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    last_token_s: float | None = None
    itl_s: list[float] = field(default_factory=list)


_LIVE: weakref.WeakSet[RequestHandle] = weakref.WeakSet()  # every RequestHandle not yet collected


_KINDS = ("json", "stream_started", "stream_waiting")
# RequestHandles garbage-collected without an outcome, by kind (incremented in __del__: no locks)
COLLECTED_UNFINISHED: dict[str, int] = dict.fromkeys(_KINDS, 0)


def _kind(h: RequestHandle) -> str:
    if not h.stream:
        return "json"
    return "stream_started" if h.timing.first_token_s is not None else "stream_waiting"


def unfinished_handles() -> dict[str, int]:
    """Live RequestHandles that have not recorded an outcome (finish not called), by kind: "json"
    (non-streamed), "stream_started" / "stream_waiting" (streamed, first output seen or not). A
    finished server has none (and COLLECTED_UNFINISHED stays 0); metrics export both
    (radixrt_tokenizer_unfinished_handles, radixrt_tokenizer_collected_unfinished_handles)."""
    out = dict.fromkeys(_KINDS, 0)
    for h in list(_LIVE):
        if not h._done:
            out[_kind(h)] += 1
    return out


class RequestHandle:
    """All samples of one HTTP request. Use as `async with handle:` then iterate `handle.events()`."""

    def __init__(self, manager: TokenizerManager, tokenizer: Any, specs: list[SampleSpec], *,
                 stream: bool, return_logprob: bool = False, top_logprobs_num: int = 0,
                 on_done: Callable[[RequestHandle, str], None] | None = None,
                 timeout_s: float | None = None) -> None:
        self.manager = manager
        self.timeout_s = timeout_s  # --request-timeout: unfinished samples then end with a 408
        self._timer: asyncio.TimerHandle | None = None
        self.id = uuid.uuid4().hex
        self.stream = stream
        self.return_logprob = return_logprob
        self.top_logprobs_num = top_logprobs_num
        self.samples = {(self.id if len(specs) == 1 else uuid.uuid4().hex): SampleState("", s, tokenizer)
                        for s in specs}
        for rid, st in self.samples.items():
            st.rid = rid
        self.queue = Inbox()
        self._unfinished = len(self.samples)
        self.timing = Timing()
        self.outcome = "aborted"
        self.on_done = on_done
        self._done_callbacks: list[Callable[[], None]] = []
        self._done = False
        _LIVE.add(self)

    def __del__(self) -> None:
        if not getattr(self, "_done", True):
            COLLECTED_UNFINISHED[_kind(self)] += 1

    async def __aenter__(self) -> RequestHandle:
        for rid, st in self.samples.items():
            self.manager.submit(protocol.GenerateReq(
                rid=rid, input_ids=ids_array(st.spec.input_ids),
                sampling=st.spec.sampling, stream=self.stream, return_logprob=self.return_logprob,
                top_logprobs_num=self.top_logprobs_num, grammar_kind=st.spec.grammar_kind,
                grammar_text=st.spec.grammar_text, cache_salt=st.spec.cache_salt), self.queue)
        if self.timeout_s is not None:
            self._timer = asyncio.get_running_loop().call_later(self.timeout_s, self._expire)
        return self

    def _expire(self) -> None:
        """--request-timeout passed: abort every unfinished sample in the scheduler (its pages are
        freed, it decodes no further) and end it with a 408 (the reader raises it). The abort is sent
        here: the 408 marks the sample finished, and `close` only releases finished samples."""
        error = f"408 the request exceeded the time limit of {self.timeout_s:g} s (--request-timeout)"
        for rid, st in self.samples.items():
            if not st.finished:
                self._end_sample(rid, "timeout", error)

    def _end_sample(self, rid: str, reason: str, error: str | None) -> None:
        """Abort `rid` in the scheduler and end it for the reader (TokenChunk.abort)."""
        self.manager.abort(rid, reason=reason)
        self.queue.put_nowait(TokenChunk.abort(rid, error))

    def abort_sample(self, index: int) -> bool:
        """End the unfinished sample of choice `index` with finish_reason "abort" (SGLang's
        /abort_request): the scheduler drops it and frees its pages, and the reader sees it finish
        with the tokens it had. False when no such sample is running."""
        for rid, st in self.samples.items():
            if st.spec.index == index and not st.finished and not self._done:
                self._end_sample(rid, "abort_request", None)
                return True
        return False

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(exc)

    def finish(self, exc: BaseException | None) -> None:
        """End the request (idempotent): abort unfinished samples, record the outcome, report it.

        `exc` is what ended the reader (None: it read to the end). The outcome follows what the
        scheduler did, not how far the client read: "ok" when every sample finished generating
        without an error (also when the client left before the last bytes of the reply, e.g. before
        a stream's [DONE]); "rejected" / "error" for an APIError (status < 500 / >= 500); else
        "aborted" (the client left or the reader failed before every sample finished). Called once
        per request by whoever ends it first (the stream's response, its body generator, `async with`).
        """
        if self._done:
            return
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
        self.close()
        self.outcome = self._outcome(exc)
        if self.on_done is not None:
            self.on_done(self, self.outcome)
        for fn in self._done_callbacks:
            fn()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call `fn()` once, after `finish` has recorded the outcome (at once if it already has)."""
        if self._done:
            fn()
        else:
            self._done_callbacks.append(fn)

    def _outcome(self, exc: BaseException | None) -> str:
        if isinstance(exc, APIError):
            return "rejected" if exc.status < 500 else "error"
        if all(s.finished and s.error is None for s in self.samples.values()):
            return "ok"
        return "aborted"

    def close(self) -> None:
        """Abort every unfinished sample; forget finished ones. Synchronous: safe when cancelled."""
        for rid, st in self.samples.items():
            if st.finished:
                self.manager.release(rid)
            else:
                self.manager.abort(rid)

    async def events(self) -> AsyncIterator[SampleEvent]:
        """Events of all samples in arrival order, until every sample has finished.

        Raises:
            APIError: a sample was rejected by the scheduler.
        """
        async for batch in self.event_batches():
            for ev in batch:
                yield ev

    @property
    def all_finished(self) -> bool:
        return self._unfinished == 0

    async def event_batches(self) -> AsyncIterator[list[SampleEvent]]:
        """The batches of `next_batch`, until every sample has finished.

        Raises:
            APIError: a sample was rejected by the scheduler.
        """
        while (batch := await self.next_batch()) is not None:
            yield batch

    async def next_batch(self) -> list[SampleEvent] | None:
        """The events of the next wake-up that has any: at most one per sample (its pending chunks
        merged), in the order the samples' first chunks arrived. None once every sample has finished.

        Raises:
            APIError: a sample was rejected by the scheduler.
        """
        samples = self.samples
        while self._unfinished:
            chunks = await self.queue.take()
            merged: dict[str, SampleEvent] = {}
            num_tokens = 0
            for chunk in chunks:
                st = samples.get(chunk.rid)
                if st is None or st.finished:
                    continue
                num_tokens += len(chunk.ids)
                try:
                    ev = st.consume(chunk)
                finally:
                    if st.finished:
                        self._unfinished -= 1
                if st.finished and chunk.error is None:
                    if st.finish_reason == "stop" and chunk.finish_reason is None:
                        self.manager.abort(chunk.rid, reason="stop")
                    else:
                        self.manager.release(chunk.rid)
                if ev is not None:
                    prev = merged.get(chunk.rid)
                    merged[chunk.rid] = ev if prev is None else _merge(prev, ev)
            self._mark_tokens(num_tokens)
            if merged:
                return list(merged.values())
        return None

    def _mark_tokens(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        now = time.perf_counter()
        t = self.timing
        if t.first_token_s is None:
            t.first_token_s = now
        elif t.last_token_s is not None:
            t.itl_s.append((now - t.last_token_s) / num_tokens)
        t.last_token_s = now

    def total_completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.samples.values())
