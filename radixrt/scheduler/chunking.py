"""How many prompt tokens a pass gives each prefilling request: the chunked-prefill budget of a step.

A pass costs about as much device time as the prompt tokens it carries (attention over a long
context aside), and every request in it, decodes included, waits for the whole pass. One long
prompt chunk therefore sets the inter-token latency of every decoding stream and the time to first
token of every request that arrives meanwhile. With chunk 8,192 a 32K prompt's passes take hundreds
of ms on an H200 and short requests beside it saw p99 TTFT of 400-600 ms; with chunk 2,048 they
saw ~160 ms, at the cost of a slower long prompt (more passes) when nothing else runs.

Adaptive chunking (the default, when --chunked-prefill-size is not given) takes both: a pass gives
a long prompt the full configured chunk while it is alone, and only `latency_chunk` tokens
(chunk / ADAPTIVE_CHUNK_DIVISOR, at least ADAPTIVE_MIN_CHUNK) while the step is *contended*: a
request decodes, or another request wants prompt tokens. Long chunks (requests whose uncomputed
prompt exceeds the cap) share those `latency_chunk` tokens per pass; short prompts still fill the
rest of the pass's budget, so a burst of short prompts is admitted as fast as before and a short
request arriving beside a long prefill joins the very next pass. The idea is that of vLLM's
long-prefill threshold (a per-request cap on long prompts' tokens per step) driven by the load.
An explicit --chunked-prefill-size fixes the chunk (the older rule: a prompt in progress takes half
of it while requests wait).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixrt.scheduler.req import Req

ADAPTIVE_CHUNK_DIVISOR = 4  # chunk 8,192 -> 2,048 tokens of long prompts per contended pass
ADAPTIVE_MIN_CHUNK = 512  # never below this (a CPU's 512-token default chunk is not cut further)


def latency_chunk(chunk_size: int, page_size: int) -> int:
    """Tokens of long prompt chunks per contended pass: chunk / ADAPTIVE_CHUNK_DIVISOR rounded down
    to a page multiple, at least min(chunk, ADAPTIVE_MIN_CHUNK) and one page."""
    cap = (chunk_size // ADAPTIVE_CHUNK_DIVISOR) // page_size * page_size
    return max(cap, min(chunk_size, ADAPTIVE_MIN_CHUNK), page_size)


def is_contended(running: Sequence[Req], num_waiting: int) -> bool:
    """True when the step has latency-sensitive company for a long prompt: a running request that
    decodes, or more than one request wanting prompt tokens (running prefills + waiting)."""
    wanting_prompt = num_waiting
    for req in running:
        if req.kv is None:
            continue
        if len(req.token_ids) - req.kv.kv_len <= 1:  # decodes (its input maybe in flight)
            return True
        wanting_prompt += 1
        if wanting_prompt > 1:
            return True
    return wanting_prompt > 1


@dataclass(slots=True)
class ChunkCap:
    """The per-pass limit on long prompt chunks. A request whose uncomputed prompt tokens exceed
    `cap` is *long*: it gets at most `cap` tokens, and long chunks together at most `long_left`
    (decremented by `take`). Requests at or under `cap` are not limited here (the pass budget and
    --max-prefill-tokens still are). `cap` >= 1. A fixed chunk has long_left unlimited and
    `on_admission` False: only prompts already in progress are cut (the rule before adaptive
    chunking, kept for an explicit --chunked-prefill-size)."""

    cap: int
    long_left: int
    on_admission: bool = True

    def limit(self, remaining: int, admitting: bool = False) -> int:
        """Most tokens a prompt with `remaining` uncomputed tokens may take now (0: none this pass);
        admitting: it is being admitted in this step (else it is running)."""
        if remaining <= self.cap or (admitting and not self.on_admission):
            return remaining
        return min(self.cap, self.long_left)

    def take(self, remaining: int, take: int) -> None:
        """Record that a prompt with `remaining` uncomputed tokens took `take` of them."""
        if remaining > self.cap:
            self.long_left -= take


def chunk_cap(chunk_size: int, page_size: int, adaptive: bool, running: Sequence[Req],
              num_waiting: int) -> ChunkCap:
    """The ChunkCap of one step. Fixed chunk (adaptive False): a prompt in progress takes half the
    chunk while requests wait, else the chunk, with no shared limit. Adaptive: latency_chunk shared
    by the long chunks when the step is contended (is_contended), else the whole chunk."""
    unlimited = 1 << 30
    if not adaptive:
        cap = chunk_size if not num_waiting else max(page_size, chunk_size // 2)
        return ChunkCap(cap=cap, long_left=unlimited, on_admission=False)
    if is_contended(running, num_waiting):
        cap = latency_chunk(chunk_size, page_size)
        return ChunkCap(cap=cap, long_left=cap)
    return ChunkCap(cap=chunk_size, long_left=unlimited)
