"""Typed messages between the three processes, and their wire encoding (no pickle).

Channels (all ZeroMQ PUSH/PULL over ipc:// in a private 0700 directory):

    tokenizer -> scheduler : GenerateReq, AbortReq, ControlReq
    scheduler -> tokenizer : TokenOutBatch, ControlResp
    scheduler -> worker    : ForwardBatch, GrammarMask, WorkerControl
    worker    -> scheduler : ForwardResult
    child     -> launcher  : Ready, Fatal

Wire format: frame 0 is an orjson header
``{"t": type, "f": {scalar fields}, "a": [[name, dtype, shape]...]}``;
each numpy-array field follows as one raw little-endian frame (int32 token ids, slots, page ids;
float32 sampling params). Decoding accepts only the closed set of types of its channel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import orjson

I32 = np.int32
F32 = np.float32


def _i32(n: int = 0) -> np.ndarray:
    return np.zeros(n, dtype=I32)


def _f32(n: int = 0) -> np.ndarray:
    return np.zeros(n, dtype=F32)


# --------------------------------------------------------------------------- handshake
@dataclass(slots=True)
class Ready:
    """A child process is up. `info` carries what the launcher passes on (e.g. the worker's pool size)."""

    process: str
    protocol_version: int
    pid: int
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Fatal:
    """A child process failed during start-up; `message` is one human-readable line."""

    process: str
    message: str
    exit_code: int = 1


# --------------------------------------------------------------------------- tokenizer <-> scheduler
@dataclass(slots=True)
class GenerateReq:
    """One request (one choice; `n > 1` arrives as n requests, one per choice).

    input_ids: int32 [prompt_len]. `sampling` holds SamplingParams fields (see sampling_params.py).
    grammar_kind / grammar_text: a constraint on the output (radixrt.constrained.GrammarKind value
    and its text, already validated at the HTTP edge); None = unconstrained.
    cache_salt: the tenant namespace of the prefix cache (KVManager.prefix_handle); None = shared.
    """

    rid: str
    input_ids: np.ndarray = field(default_factory=_i32)
    sampling: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    grammar_kind: str | None = None
    grammar_text: str = ""
    cache_salt: str | None = None


@dataclass(slots=True)
class AbortReq:
    """Abort a request (client gone, stop string matched). Unknown or finished rids are ignored."""

    rid: str
    reason: str = "abort"


@dataclass(slots=True)
class ControlReq:
    """flush_cache | get_server_info | health (a real 1-token probe)."""

    kind: str
    req_id: str


@dataclass(slots=True)
class ControlResp:
    req_id: str
    ok: bool
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class TokenOutBatch:
    """New tokens for several requests after one step.

    output_ids: int32 [sum of new tokens], request i's tokens are output_ids[offsets[i]:offsets[i+1]].
    logprobs: float32, one entry per new token of each request that asked (return_logprob), in
    request order; requests that did not ask contribute nothing. top_logprob_ids / top_logprobs:
    int32/float32, per new token of each asking request, k = top_logprobs_nums[i] values.
    top_logprobs_nums[i] is -1 for a request that did not ask (no entries in any of the three
    arrays) and k >= 0 for one that did, so the receiver needs no record of what each request asked
    for. (Until 2026-12-02 a request that did not ask also had 0 there, and the receiver, unable to
    tell it from an asking request with k = 0, dropped the logprobs of every batch mixing the two.)
    finish_reasons[i]: None while running; "stop" | "length" | "abort" when finished.
    error[i]: a client-facing message when the request was rejected (finish_reason "abort").
    """

    rids: list[str] = field(default_factory=list)
    top_logprobs_nums: list[int] = field(default_factory=list)
    offsets: np.ndarray = field(default_factory=_i32)
    output_ids: np.ndarray = field(default_factory=_i32)
    logprobs: np.ndarray = field(default_factory=_f32)
    top_logprob_ids: np.ndarray = field(default_factory=_i32)
    top_logprobs: np.ndarray = field(default_factory=_f32)
    finish_reasons: list[str | None] = field(default_factory=list)
    matched_stop: list[Any] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)


# --------------------------------------------------------------------------- scheduler <-> worker
class ForwardMode(IntEnum):
    EXTEND = 1  # every request has extend_len >= 1 new tokens (prefill / chunk / prefix-cache hit)
    DECODE = 2  # every request has exactly one new token
    MIXED = 3  # extend chunks and decode tokens in one pass (chunked prefill with running decodes)
    IDLE = 4


@dataclass(slots=True)
class ForwardBatch:
    """One forward pass, as the scheduler decided it. The worker does exactly what it says.

    B requests, T = sum(extend_lens) new tokens, U page-table writes, C copy-on-write page copies.
    Request i's new tokens are input_ids[s:s+extend_lens[i]], s = exclusive cumsum of extend_lens.

    req_rows      int32 [B]  row of the worker's device page table (req_to_page) for each request
    input_ids     int32 [T]  new tokens (a stand-in at each prev_token_pos, see below)
    prev_token_pos/prev_token_src int32 [K]: overlap scheduling sends a pass before the previous
                  one's result is back, so K inputs (at most one per request, its last) are tokens
                  the previous pass is still sampling: input_ids[prev_token_pos[k]] (an index into
                  the T tokens) is that pass's next_token_ids[prev_token_src[k]] (an index into its
                  B requests), filled in by the worker. K = 0 without overlap.
    positions     int32 [T]  their positions (prefix_len + j)
    out_cache_loc int32 [T]  KV slot (page * page_size + offset) each new token's K/V is written to
    seq_lens      int32 [B]  prefix_len + extend_len (tokens whose KV exists after this pass)
    extend_lens   int32 [B]
    upd_rows/upd_cols/upd_pages int32 [U]: req_to_page[row, col] = page, applied before the pass
    cow_src/cow_dst int32 [C]: copy the KV of whole page src to page dst (all layers), before the pass
    temperature/top_p/min_p float32 [B]; top_k int32 [B] (-1 = off); seeds int32 [B] and
    sample_steps int32 [B] (output index of the token being sampled) key a counter-based RNG, so a
    seeded request samples the same tokens whatever else is in the batch.

    Penalties and logit bias (see worker/penalties.py); all empty when no request in the batch uses them:
    frequency_penalty/presence_penalty/repetition_penalty float32 [B] (neutral 0/0/1 for a request
    without penalties and for a prompt chunk whose sample is discarded; the worker counts the token
    it samples for every request whose penalties are not neutral);
    penalty_reset_rows int32 [R]: rows just given to a request with penalties, cleared before the pass;
    penalty_prompt_rows/penalty_prompt_ids int32 [P]: (row, token) of those requests' prompts;
    penalty_output_rows/penalty_output_ids int32 [Q]: (row, token) of tokens they generated before a
    retraction (counted once each); logit_bias_idx (index into the B requests)/logit_bias_ids int32
    and logit_bias_vals float32 [L]: added to the logits, every pass.

    Cascade decode (DECODE passes only; empty otherwise): groups of requests whose first
    cascade_prefix_lens[g] tokens live in the same physical pages, so the worker reads that prefix
    once per group (radixrt.kernels.cascade_decode_attention). cascade_members int32 [M]: indices
    into the B requests, group g being members[starts[g]:starts[g+1]]; cascade_starts int32 [G+1];
    cascade_prefix_lens int32 [G], whole pages, each < the seq_len of every member.

    Grammar-constrained decoding (radixrt.constrained; empty when no request in the pass has one):
    grammar_rows int32 [R]: indices into the B requests of the constrained ones that sample;
    grammar_bitmask int32 [R * W]: their allowed-token bitmasks, row r = words [r*W, (r+1)*W),
    W = ceil(vocab_size / 32), bit j % 32 of word j // 32 set when token j is allowed. The worker
    sets the logits of disallowed tokens to -inf after penalties and logit bias, before sampling;
    logprobs stay those of the raw logits.
    grammar_deferred int32 [D]: indices into the B requests of constrained rows whose bitmask is not
    in this message (overlap scheduling: their previous token is still being sampled, so their
    grammar state is not known yet). The worker runs the model at once and, before sampling, waits
    for the GrammarMask with this batch_id, which carries exactly these rows in this order.
    Disjoint from grammar_rows; empty without overlap.

    Host KV tier (memory/host_tier.py; empty without one, and an IDLE pass may carry only these):
    N copies of whole pages, copy i being pages copy_starts[i]:copy_starts[i+1] of copy_host_pages /
    copy_device_pages (int32 [P]); copy_ids int32 [N] (reported back in ForwardResult.copies_done);
    copy_kinds int32 [N]: 0 load host -> device and 1 store device -> host (eviction), both issued
    before the pass (which waits on the device for kind 1); 2 store device -> host (write-through),
    issued after the pass. On CUDA they run on a copy stream; the host never waits for them.
    """

    batch_id: int
    mode: int
    req_rows: np.ndarray = field(default_factory=_i32)
    input_ids: np.ndarray = field(default_factory=_i32)
    prev_token_pos: np.ndarray = field(default_factory=_i32)
    prev_token_src: np.ndarray = field(default_factory=_i32)
    positions: np.ndarray = field(default_factory=_i32)
    out_cache_loc: np.ndarray = field(default_factory=_i32)
    seq_lens: np.ndarray = field(default_factory=_i32)
    extend_lens: np.ndarray = field(default_factory=_i32)
    upd_rows: np.ndarray = field(default_factory=_i32)
    upd_cols: np.ndarray = field(default_factory=_i32)
    upd_pages: np.ndarray = field(default_factory=_i32)
    cow_src: np.ndarray = field(default_factory=_i32)
    cow_dst: np.ndarray = field(default_factory=_i32)
    temperature: np.ndarray = field(default_factory=_f32)
    top_p: np.ndarray = field(default_factory=_f32)
    top_k: np.ndarray = field(default_factory=_i32)
    min_p: np.ndarray = field(default_factory=_f32)
    seeds: np.ndarray = field(default_factory=_i32)
    sample_steps: np.ndarray = field(default_factory=_i32)
    frequency_penalty: np.ndarray = field(default_factory=_f32)
    presence_penalty: np.ndarray = field(default_factory=_f32)
    repetition_penalty: np.ndarray = field(default_factory=_f32)
    penalty_reset_rows: np.ndarray = field(default_factory=_i32)
    penalty_prompt_rows: np.ndarray = field(default_factory=_i32)
    penalty_prompt_ids: np.ndarray = field(default_factory=_i32)
    penalty_output_rows: np.ndarray = field(default_factory=_i32)
    penalty_output_ids: np.ndarray = field(default_factory=_i32)
    logit_bias_idx: np.ndarray = field(default_factory=_i32)
    logit_bias_ids: np.ndarray = field(default_factory=_i32)
    logit_bias_vals: np.ndarray = field(default_factory=_f32)
    cascade_members: np.ndarray = field(default_factory=_i32)
    cascade_starts: np.ndarray = field(default_factory=_i32)
    cascade_prefix_lens: np.ndarray = field(default_factory=_i32)
    grammar_rows: np.ndarray = field(default_factory=_i32)
    grammar_bitmask: np.ndarray = field(default_factory=_i32)
    grammar_deferred: np.ndarray = field(default_factory=_i32)
    copy_ids: np.ndarray = field(default_factory=_i32)
    copy_kinds: np.ndarray = field(default_factory=_i32)
    copy_starts: np.ndarray = field(default_factory=_i32)
    copy_host_pages: np.ndarray = field(default_factory=_i32)
    copy_device_pages: np.ndarray = field(default_factory=_i32)
    return_logprob: bool = False
    top_logprobs_num: int = 0


@dataclass(slots=True)
class GrammarMask:
    """The deferred bitmask rows of pass `batch_id` (ForwardBatch.grammar_deferred), sent by the
    scheduler once it has processed the previous pass's result (its matchers accepted those tokens).

    rows int32 [D]: equal to that pass's grammar_deferred (indices into its B requests);
    bitmask int32 [D, W], W = ceil(vocab_size / 32), the layout of ForwardBatch.grammar_bitmask.
    A request that finished in the previous pass's result gets an all-ones row (its token is
    dropped anyway). The worker applies the rows with the pass's grammar_rows, before sampling.
    """

    batch_id: int
    rows: np.ndarray = field(default_factory=_i32)
    bitmask: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), I32))


@dataclass(slots=True)
class ForwardResult:
    """next_token_ids int32 [B]; logprobs float32 [B] and top ids/values [B * k] when asked.

    forward_ms: worker wall time from launch to result (ms). gpu_busy_ms: device time of the pass;
    gpu_gap_ms: device idle time between the previous pass's end and this one's start (-1 for the
    first pass). On CPU both are wall-clock stand-ins.
    copies_done int32 [D]: host-tier copies (ForwardBatch.copy_ids) finished since the last result;
    copy_load_bytes / copy_store_bytes and copy_load_s / copy_store_s: their bytes and device time.
    """

    batch_id: int
    next_token_ids: np.ndarray = field(default_factory=_i32)
    logprobs: np.ndarray = field(default_factory=_f32)
    top_logprob_ids: np.ndarray = field(default_factory=_i32)
    top_logprobs: np.ndarray = field(default_factory=_f32)
    forward_ms: float = 0.0
    gpu_busy_ms: float = 0.0
    gpu_gap_ms: float = -1.0
    copies_done: np.ndarray = field(default_factory=_i32)
    copy_load_bytes: int = 0
    copy_store_bytes: int = 0
    copy_load_s: float = 0.0
    copy_store_s: float = 0.0


@dataclass(slots=True)
class WorkerControl:
    """flush (no-op today) | shutdown."""

    kind: str


# --------------------------------------------------------------------------- encoding
TOKENIZER_TO_SCHEDULER = (GenerateReq, AbortReq, ControlReq)
SCHEDULER_TO_TOKENIZER = (TokenOutBatch, ControlResp)
SCHEDULER_TO_WORKER = (ForwardBatch, GrammarMask, WorkerControl)
WORKER_TO_SCHEDULER = (ForwardResult,)
CHILD_TO_LAUNCHER = (Ready, Fatal)


class ProtocolError(ValueError):
    """A frame that is not a well-formed message of the channel's closed set."""


# An array frame at least this large is the array's own memory, not a copy (a GrammarMask's bitmask
# is 1.2 MB for 64 rows of Qwen2.5's vocabulary). pyzmq copies smaller frames itself anyway
# (zmq.COPY_THRESHOLD, 64 KiB).
ZERO_COPY_MIN_BYTES = 1 << 16


def encode(msg: Any) -> list[bytes | memoryview]:
    """Message -> frames. numpy array fields travel as raw frames (little-endian), the rest as orjson.

    A contiguous array of ZERO_COPY_MIN_BYTES or more is framed as a view of its memory, which a
    zero-copy socket send may read after the send returns: the sender must not modify such an array
    after sending (every sender builds a message's arrays for that message).
    """
    scalars: dict[str, Any] = {}
    arrays: list[list[Any]] = []
    frames: list[bytes | memoryview] = []
    for f in dataclasses.fields(msg):
        v = getattr(msg, f.name)
        if isinstance(v, np.ndarray):
            a = np.ascontiguousarray(v)
            arrays.append([f.name, a.dtype.str, list(a.shape)])
            frames.append(memoryview(a).cast("B") if a.nbytes >= ZERO_COPY_MIN_BYTES else a.tobytes())
        else:
            scalars[f.name] = v
    header = orjson.dumps({"t": type(msg).__name__, "f": scalars, "a": arrays},
                          option=orjson.OPT_SERIALIZE_NUMPY)
    return [header, *frames]


_ALLOWED_DTYPES = {"<i4", "<f4", "<i8", "<f8", "|u1", "|b1"}


def decode(frames: list[bytes], allowed: tuple[type, ...]) -> Any:
    """Frames -> message of one of `allowed` types.

    Raises:
        ProtocolError: unknown type, wrong field set, bad dtype or frame size.
    """
    if not frames:
        raise ProtocolError("empty message")
    try:
        header = orjson.loads(frames[0])
        cls = {c.__name__: c for c in allowed}[header["t"]]
    except (orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise ProtocolError(f"bad header: {e!r}") from None
    kwargs = dict(header["f"])
    specs = header["a"]
    if len(specs) != len(frames) - 1:
        raise ProtocolError("array frame count mismatch")
    for (name, dtype, shape), buf in zip(specs, frames[1:], strict=True):
        if dtype not in _ALLOWED_DTYPES:
            raise ProtocolError(f"dtype {dtype} not allowed")
        arr = np.frombuffer(buf, dtype=np.dtype(dtype))
        if arr.size != int(np.prod(shape)):
            raise ProtocolError(f"array {name}: size mismatch")
        kwargs[name] = arr.reshape(shape)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ProtocolError(f"bad fields for {cls.__name__}: {e}") from None
