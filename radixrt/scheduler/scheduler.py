"""The scheduler's step logic, free of sockets so tests can drive it with a fake worker.

One step (`schedule`), as in continuous batching (Orca, Yu et al., OSDI 2022) with the token-budget
view of vLLM v1: running requests first (each decode needs one slot, an unfinished prompt its next
chunk), then waiting requests in policy order while the chunk budget, the running-request cap and
memory allow. Prompt chunks and decode tokens share one pass (ForwardMode.MIXED).

Memory: admission asks the KV manager for pages (free + evictable, evicting LRU leaves as needed)
and keeps one page of headroom per running request. When a running request cannot get a page, the
newest running request is retracted: its computed tokens are published to the radix tree, its
pages released, and it goes back to the head of the queue to resume from the cache.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from radixrt.memory.kv_manager import KVManager, ReqKV
from radixrt.protocol import ForwardResult, GenerateReq, TokenOutBatch
from radixrt.sampling_params import SamplingParams, sampler_seed
from radixrt.scheduler import chunking
from radixrt.scheduler.batch import ScheduledBatch, ScheduledItem
from radixrt.scheduler.cascade import find_cascade_groups
from radixrt.scheduler.chunking import ChunkCap
from radixrt.scheduler.grammar import GrammarResolved, GrammarStage
from radixrt.scheduler.outputs import OutputStage
from radixrt.scheduler.policy import AdmittedInStep, defer_for_shared_prefix, order_waiting
from radixrt.scheduler.req import Req, ReqState

log = logging.getLogger("radixrt.scheduler")
UNCHUNKED = 1 << 30  # chunk size standing for "chunked prefill off"


class Scheduler:
    """Owns the waiting queue, the running set, worker page-table rows and the KV manager.

    Args:
        kv: the KV manager (page allocator + radix cache).
        max_running_requests: cap on admitted (running) requests; also the worker's page-table rows.
        chunk_size: max new prompt tokens per pass (chunked prefill); <= 0 means unlimited.
        adaptive_chunk: bound long prompt chunks by their estimated cost, to a latency chunk's
            while decodes run, other prompts wait or short requests arrived recently
            (scheduler/chunking.py); False: the chunk is fixed in tokens (an explicit flag).
        attn_context: the model's chunking.attention_context (tokens), for chunk costs.
        clock: monotonic seconds, read at arrivals and steps (tests pass a fake).
        context_len: max prompt + output tokens. vocab_size: token ids must be below it.
        eos_token_ids: tokens that end a request (unless ignore_eos).
        max_prefill_tokens: new prompt tokens admitted per pass (--max-prefill-tokens); without
            chunking a longer prompt still runs, alone.
        cascade_min_saved_tokens: > 0 turns on cascade grouping of DECODE passes (scheduler/cascade.py)
            when it saves at least this many KV token reads; 0 = off (e.g. a backend without it).
        grammar_compiler: a radixrt.constrained.GrammarCompilerService for constrained requests
            (scheduler/grammar.py); None: they are refused with an error.
    """

    def __init__(self, kv: KVManager, *, page_size: int, max_running_requests: int, chunk_size: int,
                 context_len: int, vocab_size: int, eos_token_ids: list[int], schedule_policy: str = "lpm",
                 max_queued_requests: int = 4096, random_seed: int = 0,
                 cascade_min_saved_tokens: int = 0, max_prefill_tokens: int = UNCHUNKED,
                 grammar_compiler: Any = None, adaptive_chunk: bool = False,
                 attn_context: int = chunking.DEFAULT_ATTENTION_CONTEXT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kv = kv
        self.page_size = page_size
        self.max_running = max_running_requests
        self.chunk_size = chunk_size if chunk_size > 0 else UNCHUNKED
        self.max_prefill_tokens = max_prefill_tokens
        self.adaptive_chunk = adaptive_chunk and self.chunk_size < UNCHUNKED
        self.attn_context = attn_context
        self.clock = clock
        self.last_short_arrival_s: float | None = None  # clock() at the newest short prompt's arrival
        self.context_len = context_len
        self.vocab_size = vocab_size
        self.eos_token_ids = set(eos_token_ids)
        self.policy = schedule_policy
        self.max_queued = max_queued_requests
        self.rng = random.Random(random_seed)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.reqs: dict[str, Req] = {}
        self.free_rows = list(range(max_running_requests - 1, -1, -1))
        self.next_batch_id = 0
        self.outputs = OutputStage()  # tokens and finishes since the last take_outputs
        self.num_retractions = 0
        self.num_finished = 0
        self.num_generated_tokens = 0
        self.cascade_min_saved_tokens = cascade_min_saved_tokens
        self.num_cascade_passes = 0
        self.grammar = GrammarStage(grammar_compiler)
        # host KV tier: bytes and device seconds of the copies the worker reported done
        self.copy_totals = {"hicache_load_bytes": 0, "hicache_store_bytes": 0,
                            "hicache_load_s": 0.0, "hicache_store_s": 0.0}

    # ------------------------------------------------------------------ arrivals and aborts
    def add_request(self, msg: GenerateReq, internal: bool = False) -> Req:
        """Queue a request, or finish it at once with an error the client can act on."""
        ids = np.asarray(msg.input_ids).astype(np.int64, copy=False).reshape(-1)
        prompt = ids.tolist()  # ~10x a Python loop
        error = None
        try:
            sp = SamplingParams.from_dict(msg.sampling)
        except (ValueError, TypeError) as e:
            sp, error = SamplingParams(), str(e)
        if error is None:
            error = self._validate(ids) or self._validate_logit_bias(sp.logit_bias)
        budget = self.context_len - len(prompt)
        max_new = budget if sp.max_new_tokens is None else min(sp.max_new_tokens, budget)
        seed = sp.seed if sp.seed is not None else self.rng.randrange(1 << 31)
        req = Req(rid=msg.rid, prompt_ids=prompt, sampling=sp, max_new_tokens=max(max_new, 0),
                  seed=sampler_seed(seed), return_logprob=msg.return_logprob,
                  top_logprobs_num=msg.top_logprobs_num, internal=internal,
                  prefix=self.kv.prefix_handle(ids, msg.cache_salt))
        # queued = waiting beyond the running set's free slots: a burst of up to max_running +
        # max_queued arrivals before the next step is taken whole (all of it waits at first)
        free_slots = max(0, self.max_running - len(self.running))
        if error is None and len(self.waiting) - free_slots >= self.max_queued:
            error = "too many queued requests"
        if error is None and msg.grammar_kind is not None:
            error = self.grammar.submit(req, msg.grammar_kind, msg.grammar_text)
        if error is not None:
            self._finish(req, "abort", error=error)
            return req
        self.reqs[req.rid] = req
        if req.max_new_tokens == 0:
            self._finish(req, "length")
            return req
        self.waiting.append(req)
        short = len(prompt) <= chunking.latency_chunk(self.chunk_size, self.page_size)
        if self.adaptive_chunk and short and not internal:  # interactive traffic (is_interactive)
            self.last_short_arrival_s = self.clock()
        return req

    def _validate(self, prompt: np.ndarray) -> str | None:
        if not len(prompt):
            return "the prompt is empty"
        if len(prompt) >= self.context_len:
            return (f"context_length_exceeded: the prompt has {len(prompt)} tokens; this model's "
                    f"context length is {self.context_len}")
        if int(prompt.min()) < 0 or int(prompt.max()) >= self.vocab_size:
            return f"token ids must be in [0, {self.vocab_size})"
        return None

    def _validate_logit_bias(self, bias: dict[str, float]) -> str | None:
        """Keys must be token ids of the vocabulary and values in [-100, 100] (batch.py relies on it)."""
        for key, value in bias.items():
            # ASCII digits only: str.isdigit() also takes "²" or "٥", which int() refuses or reads as 5
            if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) < self.vocab_size):
                return f"logit_bias: key {key!r} is not a token id in [0, {self.vocab_size})"
            if not (isinstance(value, int | float) and -100.0 <= value <= 100.0):
                return f"logit_bias: value for {key} must be a number in [-100, 100]"
        return None

    def abort(self, rid: str) -> None:
        """Abort a waiting or running request; its pages are released now. Unknown rids: ignored."""
        req = self.reqs.get(rid)
        if req is None or req.is_finished:
            return
        self._finish(req, "abort")

    # ------------------------------------------------------------------ one step
    def schedule(self) -> ScheduledBatch | None:
        """Decide the next pass; None when there is nothing to run."""
        sb = ScheduledBatch(batch_id=self.next_batch_id)
        if self.grammar.compiling:
            for req, error in self.grammar.poll():
                self._finish(req, "abort", error=error)
        # new prompt tokens in this pass: a chunk, at most --max-prefill-tokens (unchunked: see _admit)
        budget = (self.chunk_size if self.chunk_size >= UNCHUNKED
                  else min(self.chunk_size, self.max_prefill_tokens))
        # long prompts' tokens in this pass (scheduler/chunking.py): adaptive, bounded by their cost,
        # a latency chunk's beside decodes, other prompts or recent short arrivals; a fixed chunk
        # leaves half of it to waiting requests
        recent = self.adaptive_chunk and chunking.is_interactive(self.clock(), self.last_short_arrival_s)
        cap = chunking.chunk_cap(self.chunk_size, self.page_size, self.adaptive_chunk, self.running,
                                 len(self.waiting), self.attn_context, recent)
        items = sb.items
        for req in list(self.running):
            if req.state is not ReqState.RUNNING:  # retracted while making room for another
                continue
            if self._final_token_pending(req):
                continue  # overlap: its last token is still being sampled (and ends it)
            start = req.kv.kv_len  # type: ignore[union-attr]  # running: kv set
            to_compute = len(req.token_ids) - start
            take = 1 if to_compute == 1 else min(to_compute, budget, cap.limit(to_compute, start))
            if take <= 0:
                continue
            if take > 1:
                cap.take(to_compute, start, take)
            item = self._reserve(req, take, sb)
            if item is not None:
                items.append(item)
                budget -= take if (item.is_prefill or take > 1) else 0  # resumed requests count too
        self._admit(sb, budget, cap)
        if not items:
            if not self.kv.has_copies:
                return None
            # an IDLE pass carrying host-tier copies (or collecting those in flight): a request
            # waits for its load while nothing else runs
            sb.copy_ops = self.kv.take_copy_ops()
            self.next_batch_id += 1
            return sb
        self._publish_prompt_chunks(sb)
        sb.copy_ops = self.kv.take_copy_ops()
        sb.grammar = self.grammar.fill(items) if self.grammar.compiler is not None else None
        for j, it in enumerate(items):
            req = it.req
            if req.num_in_flight:  # its last known token, this pass's last input, is being sampled
                it.prev_src = req.in_flight_src  # by the previous pass (the one pass in flight)
            if it.completes:  # the token this pass samples is in flight until its result
                it.out_pos = len(req.output_ids)
                req.begin_output(j)
        if (self.cascade_min_saved_tokens > 0 and len(sb.items) > 1
                and all(it.extend_len == 1 for it in sb.items)):
            sb.cascade = find_cascade_groups(sb.items, self.page_size, self.cascade_min_saved_tokens)
            self.num_cascade_passes += sb.cascade is not None
        self.next_batch_id += 1
        return sb

    def prefill_cost(self, sb: ScheduledBatch) -> float:
        """Estimated device time of sb's prompt chunks, in tokens of linear-layer time
        (chunking.prefill_cost): a chunk deep into a long prompt costs more than its token count."""
        return chunking.prefill_cost([(it.start, it.extend_len) for it in sb.items], self.attn_context)

    def _publish_prompt_chunks(self, sb: ScheduledBatch) -> None:
        """Publish the prompt chunks of this pass to the radix tree now, before the pass runs.

        Passes run in launch order on one device stream and a pass writes its KV before any later
        pass reads it, so a pass scheduled while this one is in flight (overlap scheduling) may
        already reuse these pages: requests deferred behind a shared prefix then start in the very
        next pass instead of one pass later. Only whole pages are published (cache_unfinished_req),
        and only after every admission of this pass, so no request of this pass matches a page this
        pass writes (a copy-on-write copy runs before the model, so it must never read such a page).
        """
        for it in sb.items:
            if it.req.kv is not None and (not it.completes or it.is_prefill):
                self.kv.cache_unfinished_req(it.req.kv, it.req.all_ids)

    def _final_token_pending(self, req: Req) -> bool:
        """Overlap: the token being sampled for req (in flight) is its last one, so it has
        nothing left to run."""
        return req.num_in_flight > 0 and (len(req.output_ids) >= req.max_new_tokens
                                          or len(req.token_ids) >= self.context_len)

    def _reserve(self, req: Req, take: int, sb: ScheduledBatch) -> ScheduledItem | None:
        """Pages for `take` more tokens of a running request, retracting newer requests if needed."""
        kv = req.kv
        assert kv is not None
        start = kv.kv_len
        end = start + take
        while (slots := self.kv.reserve(kv, end)) is None:
            victim = self._retract_victim(exclude=req, scheduled=sb)
            if victim is None:  # nothing else to retract: retract this one
                self._retract(req)
                return None
            self._retract(victim)
        return ScheduledItem(req=req, start=start, extend_len=take, slots=slots,
                             completes=end == len(req.token_ids), is_prefill=not req.output_ids)

    def _retract_victim(self, exclude: Req, scheduled: ScheduledBatch) -> Req | None:
        in_batch = {id(it.req) for it in scheduled.items}
        for req in reversed(self.running):
            if req is not exclude and id(req) not in in_batch:
                return req
        return None

    def _retract(self, req: Req) -> None:
        """Preempt: publish computed KV to the tree, release pages, requeue at the head."""
        assert req.kv is not None
        self.kv.cache_finished_req(req.kv, req.all_ids, end=req.kv.kv_len)
        req.kv = None
        self._release_row(req)
        self.running.remove(req)
        req.state = ReqState.WAITING
        req.num_retractions += 1
        self.num_retractions += 1
        self.waiting.appendleft(req)
        log.info("retracted %s (%d tokens) under KV pressure", req.rid, req.seq_len)

    def _admit(self, sb: ScheduledBatch, budget: int, cap: ChunkCap) -> None:
        """Admit waiting requests in policy order while budget, the running cap and memory allow."""
        if not self.waiting:
            return
        # still prefilling, or prefilled by a pass in flight (overlap): their whole prompt pages are
        # published (_publish_prompt_chunks) but a prompt sharing more than that must still wait
        admitted = AdmittedInStep([r for r in self.running if r.num_resolved_outputs == 0])
        prefill_left = self.max_prefill_tokens  # new prompt tokens admitted in this pass
        for req in order_waiting(self.waiting, self.policy, self.kv):
            if (budget <= 0 or prefill_left <= 0 or len(self.running) >= self.max_running
                    or not self.free_rows):
                break
            if req.has_in_flight_output or not GrammarStage.is_ready(req):
                continue  # retracted while its last token was in flight, or its grammar compiling
            if not self.kv.prepare_load(req.all_ids, req.prefix):
                continue  # its KV is being loaded back from the host tier; the others go on
            got = self.kv.admit(req.all_ids, handle=req.prefix)
            if got is None:
                if not self.running and not self.kv.has_copies:  # alone, every page available: never fits
                    self._finish_unfittable(req)
                    continue
                break
            kv, cow = got
            if defer_for_shared_prefix(req, kv.cached_len, admitted):
                self.kv.release(kv)
                continue
            remaining = req.seq_len - kv.kv_len
            take = min(remaining, budget, prefill_left, cap.limit(remaining, kv.kv_len, admitting=True))
            if take <= 0:  # a long prompt while this pass's long chunks are spent: shorter ones go on
                self.kv.release(kv)
                continue
            if take < remaining and self.chunk_size >= UNCHUNKED:
                if prefill_left < self.max_prefill_tokens:  # unchunked: whole prompts only, but
                    self.kv.release(kv)  # a prompt longer than the cap may run alone
                    break
                take = req.seq_len - kv.kv_len
            headroom = len(self.running) + 1
            need_pages = self.kv.num_pages_needed(kv, kv.kv_len + take)
            if self.kv.num_available_pages() < need_pages + headroom and self.running:
                self.kv.release(kv)
                break
            slots = self.kv.reserve(kv, kv.kv_len + take)
            if slots is None:
                self.kv.release(kv)
                if not self.running and not self.kv.has_copies:
                    self._finish_unfittable(req)
                    continue
                break
            cap.take(remaining, kv.kv_len - take, take)
            self._start_running(req, kv, cow, slots, take, sb)
            admitted.append(req)
            budget -= take
            prefill_left -= take

    def _start_running(self, req: Req, kv: ReqKV, cow: list[tuple[int, int]], slots: list[int], take: int,
                       sb: ScheduledBatch) -> None:
        """Move an admitted request (its KV reserved up to kv.kv_len, `take` new tokens of it in
        this pass) from waiting to running, with a request row, and schedule its first item."""
        start = kv.kv_len - take
        self.waiting.remove(req)
        req.kv, req.state = kv, ReqState.RUNNING
        if req.num_retractions == 0:
            req.cached_tokens = kv.cached_len
        req.req_row, req.pages_sent = self.free_rows.pop(), 0
        self.running.append(req)
        sb.cow_pairs.extend(cow)
        sb.items.append(ScheduledItem(req=req, start=start, extend_len=take, slots=slots,
                                      completes=start + take == req.seq_len, is_prefill=not req.output_ids))

    # ------------------------------------------------------------------ results
    def resolve_grammar(self, sb: ScheduledBatch, res: ForwardResult) -> GrammarResolved:
        """The part of `process_result` the next pass's deferred mask rows wait for, done first
        (GrammarStage.resolve); hand the record to `process_result`, which does the rest.
        Between the two nothing else may touch the pass's requests."""
        return self.grammar.resolve(sb, res, self._check_finish)

    def process_result(self, sb: ScheduledBatch, res: ForwardResult,
                       early: GrammarResolved | None = None) -> None:
        """Resolve sampled tokens, publish computed prefixes, finish requests.

        With overlap scheduling the next pass was already scheduled: a request may since have been
        retracted (kv None; its token is still resolved) or aborted (finished; skipped). `early`:
        `resolve_grammar`'s record of this result, when the pipeline ran it first (its constrained
        tokens are resolved and accepted already).
        """
        assert res.batch_id == sb.batch_id, "results out of order"
        assert early is None or early.batch_id == sb.batch_id, "resolve_grammar of another pass"
        if len(res.copies_done):
            self.kv.copies_done(res.copies_done.tolist())
            totals = self.copy_totals
            totals["hicache_load_bytes"] += res.copy_load_bytes
            totals["hicache_store_bytes"] += res.copy_store_bytes
            totals["hicache_load_s"] += res.copy_load_s
            totals["hicache_store_s"] += res.copy_store_s
        k = int(res.top_logprob_ids.size // max(len(sb), 1)) if res.top_logprob_ids.size else 0
        # Python ints, one conversion for the whole pass
        toks = res.next_token_ids.tolist() if early is None else early.token_ids
        finished = ReqState.FINISHED
        num_generated = 0
        for i, it in enumerate(sb.items):
            req = it.req
            if req.state is finished:
                continue
            tok = toks[i]
            pre = early.outcomes[i] if early is not None else None
            if it.completes and pre is None:
                req.resolve_output(it.out_pos, tok)
            if req.kv is not None and (not it.completes or it.is_prefill):
                # mostly done when the pass was scheduled (_publish_prompt_chunks); this adds a page
                # completed since, when a later pass's reserve has moved kv_len past a page edge
                self.kv.cache_unfinished_req(req.kv, req.all_ids)
            if not it.completes:
                continue
            if pre is not None:
                reason, matched = pre
            else:
                reason, matched = GrammarStage.accept(req, tok) if req.matcher is not None else (None, None)
            if reason == "abort":
                self._finish(req, reason, error=matched)
                continue
            req.out.token_ids.append(tok)
            num_generated += 1
            if req.return_logprob:
                OutputStage.add_logprobs(req, res, i, k)
            if reason is None:
                reason, matched = self._check_finish(req, tok, it.out_pos + 1)
            if reason is not None:
                req.matched_stop = matched
                self._finish(req, reason)
        self.num_generated_tokens += num_generated

    def _check_finish(self, req: Req, tok: int, num_out: int) -> tuple[str | None, Any]:
        """Finish rule for the `num_out`-th output token `tok`."""
        sp = req.sampling
        if not sp.ignore_eos and tok in self.eos_token_ids:
            return "stop", tok
        if tok in sp.stop_token_ids:
            return "stop", tok
        if num_out >= req.max_new_tokens or len(req.prompt_ids) + num_out >= self.context_len:
            return "length", None
        return None, None

    def _finish(self, req: Req, reason: str, error: str | None = None) -> None:
        req.drop_in_flight_outputs()  # overlap: a token sampled after the end is not output
        self.kv.release_handle(req.prefix)  # a waiting request's load (host tier), if any
        if req.kv is not None:
            if reason == "abort":
                self.kv.release(req.kv)
            else:
                self.kv.cache_finished_req(req.kv, req.all_ids, end=req.kv.kv_len)
            req.kv = None
        if req.state is ReqState.RUNNING:
            self.running.remove(req)
            self._release_row(req)
        elif req in self.waiting:  # retracted while its last token was in flight (overlap)
            self.waiting.remove(req)
        req.state = ReqState.FINISHED
        req.finish_reason, req.error = reason, error
        self.reqs.pop(req.rid, None)
        self.outputs.finished.append(req)
        self.num_finished += 1

    def _finish_unfittable(self, req: Req) -> None:
        """A waiting request that cannot be admitted even with nothing else running: waiting would
        spin forever. With output so far it ends as `length` (the KV pool is its limit, like the
        context length); a prompt that cannot fit ends with an error."""
        pool_tokens = self.kv.pool_tokens
        log.warning("%s (%d tokens) cannot fit in the KV pool (%d tokens) even alone; finishing it",
                    req.rid, req.seq_len, pool_tokens)
        if req.num_resolved_outputs:
            self._finish(req, "length")
        else:
            self._finish(req, "abort", error=f"the KV cache ({pool_tokens} tokens) cannot hold this "
                         f"request's {req.seq_len} tokens; raise --max-total-tokens or --mem-fraction-static")

    def _release_row(self, req: Req) -> None:
        if req.req_row >= 0:
            self.free_rows.append(req.req_row)
            req.req_row, req.pages_sent = -1, 0

    # ------------------------------------------------------------------ outputs
    def take_outputs(self) -> tuple[TokenOutBatch | None, list[Req]]:
        """New tokens and finishes since the last call (see OutputStage.take, scheduler/outputs.py)."""
        return self.outputs.take(self.running)

    # ------------------------------------------------------------------ introspection
    @property
    def is_idle(self) -> bool:
        """Nothing running or waiting, and no host-tier copy left to run or collect."""
        return not self.running and not self.waiting and not self.kv.has_copies

    def flush_cache(self) -> bool:
        """Empty the radix tree; refused (False) while any request is running or waiting."""
        if not self.is_idle:
            return False
        self.kv.flush()
        return True

    def check_invariants(self) -> None:
        self.kv.check_invariants(r.kv for r in self.running if r.kv is not None)

    def stats(self) -> dict[str, Any]:
        s = dict(self.kv.stats())
        kvs = [r.kv for r in self.running if r.kv is not None]
        allocated = sum(len(kv.pages) for kv in kvs) * self.page_size
        s.update(running_kv_slots_allocated=allocated,  # internal fragmentation: last pages' tails
                 running_kv_slots_unused=allocated - sum(kv.kv_len for kv in kvs))
        s.update(num_running_reqs=len(self.running), num_waiting_reqs=len(self.waiting),
                 num_retractions=self.num_retractions, num_finished_reqs=self.num_finished,
                 num_generated_tokens=self.num_generated_tokens, num_cascade_passes=self.num_cascade_passes)
        if self.kv.host_tier_enabled:
            s.update(self.copy_totals)
        return s
