"""How many prompt tokens a pass gives each prefilling request: the chunked-prefill budget of a step.

Every request in a pass waits for the whole pass, so the longest prompt chunk in it sets the
inter-token latency of every decoding stream, and a request that arrives meanwhile waits for the
pass in flight and then for the pass it joins: its TTFT is about two pass times. With chunk 8,192 a
32K prompt's passes take hundreds of ms on an H200 and short requests beside it saw p99 TTFT of
400-600 ms; with chunk 2,048 ~220-240 ms, with 1,024 ~160 ms, at the cost of a slower long prompt.

Adaptive chunking (the default, when --chunked-prefill-size is not given) bounds a pass by an
estimate of its device time, not by tokens alone (`chunk_cost`): a prompt token costs its linear
layers plus attention over its context, and at 30K tokens of context attention costs more than the
linear layers on a 7B model, so a fixed token count grows ~2.4x slower from a prompt's first chunk
to its last. The long prompt chunks of one pass (requests whose uncomputed prompt exceeds
`latency_chunk`) share a cost budget:

- *contended* (`is_contended`: a request decodes, another request wants prompt tokens, or a short
  request arrived within INTERACTIVE_WINDOW_S): what `latency_chunk` tokens cost from a prompt's
  start (chunk / ADAPTIVE_CHUNK_DIVISOR, at least ADAPTIVE_MIN_CHUNK), so every pass takes about as
  long as a first latency chunk, however deep into a 32K prompt it is;
- otherwise: what the whole chunk costs from a prompt's start (a lone long prompt keeps its
  throughput; its late passes are cut to the time of its first).

Short prompts (at most `latency_chunk` uncomputed tokens) are not cut: they fill the rest of the
pass's token budget, so a burst of short prompts is admitted as fast as before and a short request
arriving beside a long prefill joins the very next pass. The idea is that of vLLM's long-prefill
threshold (a per-request cap on long prompts' tokens per step) driven by the load, with the cap in
estimated time (the attention term as in the FLOP count of Kaplan et al. 2020, table 1, with the
value product counted too). An
explicit --chunked-prefill-size fixes the chunk in tokens (the older rule: a prompt in progress
takes half of it while requests wait). Nothing here reads a clock: times are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from radixrt.scheduler.req import Req

ADAPTIVE_CHUNK_DIVISOR = 4  # chunk 8,192 -> 2,048 tokens of long prompts per contended pass
ADAPTIVE_MIN_CHUNK = 512  # never below this (a CPU's 512-token default chunk is not cut further)
# A short request arrived this recently: more are likely to arrive during the next pass (interactive
# traffic), so a lone long prompt takes contended passes. Several times a 32K prefill on an H200
# (~1.3-2 s), so the whole prefill of a long prompt sent amid traffic keeps short passes; a lone
# long prompt in latency passes loses ~5-15% of its prefill speed (more, smaller passes).
INTERACTIVE_WINDOW_S = 5.0
# Attention's FLOP rate relative to the linear layers' on the H200: extend attention at 8,192 causal
# ran at ~440 and 4,096 over 4,096 cached at ~390 TFLOP/s against ~600-675 for bf16 matmuls
# (docs/benchmarks.md, attention kernel sweep), so an attention FLOP costs ~1.5 linear FLOPs.
ATTENTION_EFFICIENCY = 2.0 / 3.0
# attention_context when the model's shape is unknown: below a 7B model's (Qwen2.5-7B: 21,674), so
# late chunks are cut rather more than needed (latency first)
DEFAULT_ATTENTION_CONTEXT = 16384


def latency_chunk(chunk_size: int, page_size: int) -> int:
    """Tokens of long prompt chunks per contended pass from a prompt's start: chunk /
    ADAPTIVE_CHUNK_DIVISOR rounded down to a page multiple, at least min(chunk, ADAPTIVE_MIN_CHUNK)
    and one page. A prompt with at most this many uncomputed tokens is short (never cut)."""
    cap = (chunk_size // ADAPTIVE_CHUNK_DIVISOR) // page_size * page_size
    return max(cap, min(chunk_size, ADAPTIVE_MIN_CHUNK), page_size)


def attention_context(hidden_size: int, intermediate_size: int, q_size: int, kv_size: int) -> int:
    """Context length (tokens) at which one prompt token's attention costs as much device time as
    its linear layers, for a dense decoder layer (q/k/v/o projections, gated MLP): linear FLOPs per
    token 2 x params; attention FLOPs per (query, key) pair 4 x q_size (QK^T and PV); scaled by
    ATTENTION_EFFICIENCY. Qwen2.5-7B: 21,674; SmolLM2-135M: 2,048. Tensor parallelism splits both
    alike, so the ratio holds per GPU. Sizes in elements; raises ValueError when one is < 1."""
    if min(hidden_size, intermediate_size, q_size, kv_size) < 1:
        raise ValueError("model sizes must be >= 1")
    params = hidden_size * (q_size + 2 * kv_size) + q_size * hidden_size + 3 * hidden_size * intermediate_size
    return max(1, int(ATTENTION_EFFICIENCY * 2 * params / (4 * q_size)))


def chunk_cost(start: int, extend_len: int, attn_context: int) -> float:
    """Estimated device time of computing prompt positions [start, start + extend_len), in tokens
    of linear-layer time: each token costs 1 plus (keys it attends to) / attn_context, the keys of
    position p being p + 1 (causal). Equals extend_len at start 0 up to a (extend_len / 2) /
    attn_context term; decodes, sampling and the LM head are not counted."""
    return extend_len * (1.0 + (start + (extend_len + 1) / 2.0) / attn_context)


def tokens_within_cost(start: int, cost: float, attn_context: int) -> int:
    """The most tokens from position `start` whose chunk_cost is at most `cost` (0 if none fit):
    the root of the quadratic chunk_cost(start, n) = cost, rounded down."""
    if cost <= 0:
        return 0
    a = 1.0 / (2.0 * attn_context)
    b = 1.0 + (start + 0.5) / attn_context
    n = int((-b + math.sqrt(b * b + 4.0 * a * cost)) / (2.0 * a))
    tol = cost * (1.0 + 1e-9)  # the full chunk from position 0 must fit exactly
    while chunk_cost(start, n + 1, attn_context) <= tol:
        n += 1
    while n > 0 and chunk_cost(start, n, attn_context) > tol:
        n -= 1
    return n


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


def is_interactive(now_s: float, last_short_arrival_s: float | None) -> bool:
    """True when a short request arrived within INTERACTIVE_WINDOW_S before now_s (seconds on one
    monotonic clock; None: none arrived yet)."""
    return last_short_arrival_s is not None and now_s - last_short_arrival_s <= INTERACTIVE_WINDOW_S


@dataclass(slots=True)
class ChunkCap:
    """The per-pass limit on long prompt chunks. A request whose uncomputed prompt tokens exceed
    `cap` is *long*. Adaptive (`long_cost_left` not None): the long chunks of the pass share
    `long_cost_left` (chunk_cost units, decremented by `take`); the first one always gets at least
    up to its next page edge, so a prompt always progresses. Fixed (`long_cost_left` None): a long
    prompt in progress gets at most `cap` tokens, with no shared limit, and `on_admission` False:
    only prompts already running are cut (the rule before adaptive chunking, kept for an explicit
    --chunked-prefill-size). Requests at or under `cap` are not limited here (the pass budget and
    --max-prefill-tokens still are). `cap` >= 1; positions and counts in tokens."""

    cap: int
    long_cost_left: float | None = None
    attn_context: int = DEFAULT_ATTENTION_CONTEXT
    page_size: int = 1
    on_admission: bool = True
    num_long: int = 0  # long chunks taken this pass

    def limit(self, remaining: int, start: int, admitting: bool = False) -> int:
        """Most tokens a prompt with `remaining` uncomputed tokens from position `start` may take
        now (0: none this pass); admitting: it is being admitted in this step (else it is running)."""
        if remaining <= self.cap or (admitting and not self.on_admission):
            return remaining
        if self.long_cost_left is None:
            return self.cap
        n = tokens_within_cost(start, self.long_cost_left, self.attn_context)
        end = (start + n) // self.page_size * self.page_size  # chunks end on a page edge
        n = end - start if end > start else n
        if self.num_long == 0:  # the pass's first long chunk: at least up to the next page edge
            n = max(n, self.page_size - start % self.page_size)
        return min(n, remaining)

    def take(self, remaining: int, start: int, take: int) -> None:
        """Record that a prompt with `remaining` uncomputed tokens from `start` took `take` of them."""
        if remaining > self.cap:
            self.num_long += 1
            if self.long_cost_left is not None:
                self.long_cost_left -= chunk_cost(start, take, self.attn_context)


def chunk_cap(chunk_size: int, page_size: int, adaptive: bool, running: Sequence[Req], num_waiting: int,
              attn_context: int = DEFAULT_ATTENTION_CONTEXT, interactive: bool = False) -> ChunkCap:
    """The ChunkCap of one step. Fixed chunk (adaptive False): a prompt in progress takes half the
    chunk while requests wait, else the chunk. Adaptive: prompts over latency_chunk are long; they
    share the cost of latency_chunk tokens from position 0 when the step is contended (is_contended,
    or `interactive`: see is_interactive), else the cost of the whole chunk from position 0."""
    if not adaptive:
        cap = chunk_size if not num_waiting else max(page_size, chunk_size // 2)
        return ChunkCap(cap=cap, on_admission=False)
    cap = latency_chunk(chunk_size, page_size)
    tokens = cap if interactive or is_contended(running, num_waiting) else chunk_size
    return ChunkCap(cap=cap, long_cost_left=chunk_cost(0, tokens, attn_context), attn_context=attn_context,
                    page_size=page_size)


def prefill_cost(chunks: Sequence[tuple[int, int]], attn_context: int) -> float:
    """chunk_cost summed over a pass's prompt chunks, given as (start, extend_len) pairs; chunks of
    one token (decodes) are left out."""
    return sum(chunk_cost(s, n, attn_context) for s, n in chunks if n > 1)
