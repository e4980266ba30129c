"""A request as the scheduler sees it: tokens known, tokens whose KV exists, and its KV pages.

Overlap scheduling builds the next pass before the result of the one in flight arrives, so a
request may have outputs whose token is still being sampled: it counts them (`num_in_flight`, as
vLLM counts num_output_placeholders), and they are always its last outputs. Their entries in
`output_ids` / `token_ids` hold the stand-in IN_FLIGHT_TOKEN, which nothing reads as a token: the
pass that takes one as input names it in `ForwardBatch.prev_token_pos` / `prev_token_src` (the
worker fills in what it sampled), and `resolve_output` writes the real token when the result is
processed. Results are processed in launch order, so the oldest in-flight output resolves first.

There are no separate prefill and decode phases: every step the request's computed tokens
(`kv.kv_len`) catch up with its known tokens (`prompt + output`), as in vLLM v1's scheduler.
A fresh prompt is an extend of many tokens (maybe over several chunks); decode is an extend of one.

    all_ids:  | prompt .......................... | output ........ |
    kv_len:   |<-- KV in the pool (cached + computed) -->|
    to run:                                      |<- kv_len .. len(all_ids) ->|
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from radixrt.memory.kv_manager import PrefixHandle, ReqKV
from radixrt.sampling_params import SamplingParams
from radixrt.scheduler.outputs import PendingOutput

IN_FLIGHT_TOKEN = 0  # stand-in for an output being sampled by a pass in flight; never read as a token


class ReqState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Req:
    """One generation request (one choice of an `n > 1` group is its own Req).

    prompt_ids: the original prompt. output_ids: tokens sampled so far. max_new_tokens is resolved
    against the context length at arrival. kv is None while waiting (no pages held).
    """

    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    seed: int
    return_logprob: bool = False
    top_logprobs_num: int = 0
    internal: bool = False  # health probes: no output to the tokenizer process
    output_ids: list[int] = field(default_factory=list)
    num_in_flight: int = 0  # last outputs whose token a pass in flight is sampling (overlap)
    in_flight_src: int = -1  # index of this request in the pass sampling its newest in-flight output
    state: ReqState = ReqState.WAITING
    kv: ReqKV | None = None
    req_row: int = -1  # row of the worker's page table while running
    pages_sent: int = 0  # page-table entries already sent to the worker for req_row
    cached_tokens: int = 0  # prompt tokens served from the radix cache (first admission)
    num_retractions: int = 0
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    error: str | None = None
    out: PendingOutput = field(default_factory=PendingOutput)  # since the last TokenOutBatch

    token_ids: list[int] = field(default_factory=list)  # prompt + output, kept in step (O(1) reads)
    # cascade grouping cache (scheduler/cascade.py): (leader's kv, own kv) and their common pages
    cascade_key: tuple[Any, Any] | None = None
    cascade_common: int = 0
    # the KV manager's handle for its prefix matches while waiting (lpm probe, admit): makes a
    # probe the tree cannot have changed cheap (KVManager.prefix_handle); None: plain matches
    prefix: PrefixHandle | None = None
    # grammar-constrained decoding (scheduler/grammar.py): the compile in progress, then the
    # RequestMatcher, which has accepted exactly the resolved outputs (num_resolved_outputs)
    grammar: Any = None  # radixrt.constrained.GrammarHandle until compiled
    matcher: Any = None  # radixrt.constrained.RequestMatcher once compiled

    def __post_init__(self) -> None:
        self.token_ids = self.prompt_ids + self.output_ids
        # Grow the (exactly sized) list once now, at arrival: its first append would otherwise
        # reallocate and copy the whole prompt inside the pass that admits the request.
        self.token_ids.append(0)
        self.token_ids.pop()

    def begin_output(self, sample_index: int) -> None:
        """A pass samples this request's next output: append it as in flight. `sample_index` is the
        request's index in that pass (where the pass's next_token_ids will hold the token)."""
        self.output_ids.append(IN_FLIGHT_TOKEN)
        self.token_ids.append(IN_FLIGHT_TOKEN)
        self.num_in_flight += 1
        self.in_flight_src = sample_index

    def resolve_output(self, out_pos: int, tok: int) -> None:
        """The oldest in-flight output, at output index `out_pos`, was sampled as `tok`."""
        self.output_ids[out_pos] = tok
        self.token_ids[len(self.prompt_ids) + out_pos] = tok
        self.num_in_flight -= 1

    @property
    def has_in_flight_output(self) -> bool:
        """Its last output is being sampled by a pass in flight."""
        return self.num_in_flight > 0

    @property
    def num_resolved_outputs(self) -> int:
        return len(self.output_ids) - self.num_in_flight

    def drop_in_flight_outputs(self) -> None:
        """Forget the outputs still in flight (the request ended: a token sampled after the end is
        not output)."""
        for _ in range(self.num_in_flight):
            self.output_ids.pop()
            self.token_ids.pop()
        self.num_in_flight = 0

    @property
    def all_ids(self) -> list[int]:
        """Prompt + output. The live list: callers must not mutate it."""
        return self.token_ids

    @property
    def seq_len(self) -> int:
        """Tokens known (prompt + output)."""
        return len(self.token_ids)

    @property
    def kv_len(self) -> int:
        return 0 if self.kv is None else self.kv.kv_len

    @property
    def num_to_compute(self) -> int:
        """Known tokens whose KV is not yet in the pool."""
        return self.seq_len - self.kv_len

    @property
    def is_finished(self) -> bool:
        return self.state is ReqState.FINISHED
