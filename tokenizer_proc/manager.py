"""TokenizerManager: the tokenizer process's side of the scheduler channels.

Owns the two ZeroMQ sockets (PUSH to `addrs.scheduler_in`, PULL bound on `addrs.tokenizer_in`), the
table of live request ids, and the receive loop that splits each `TokenOutBatch` into per-request
`TokenChunk`s and puts them in that request's `Inbox`.

Throughput: the receive loop drains every batch already queued on the socket before it yields to the
event loop, and an `Inbox` hands its reader all chunks that arrived since the last read, so a request
whose task runs late (the process is behind) handles several passes' tokens in one wake-up and one
socket write, instead of one per token. The per-batch split works on Python lists (one `tolist()`
per array per batch), not per-request numpy slices. Per-request text state (detokenizer,
stop strings) lives in request_state.py; HTTP shapes live in the serving modules.

Threading: everything runs on the one event loop of the process. The PUSH socket is a plain
(synchronous) zmq socket with an unbounded send queue, so `send`/`abort` never block and are safe to
call from `finally` blocks of cancelled tasks.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from radixrt import protocol
from radixrt.ipc import IpcAddresses, Sender

logger = logging.getLogger(__name__)


SHUTDOWN_ERROR = "503 server is shutting down"  # TokenChunk.error for every in-flight sample on shutdown
_DRAIN_MAX = 256  # batches handled per wake-up of the receive loop before it yields to the event loop
_DETACH_EVERY = 64  # an Inbox this many chunks behind its reader copies their logprobs out of the frames


@dataclass(slots=True)
class TokenChunk:
    """One request's slice of a TokenOutBatch.

    ids: the new token ids; logprobs float32 [m] or None; top_ids int32 [m, k] / top_logprobs float32 [m, k]
    or None.
    """

    rid: str
    ids: list[int]
    logprobs: np.ndarray | None
    top_ids: np.ndarray | None
    top_logprobs: np.ndarray | None
    finish_reason: str | None
    matched_stop: Any
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    error: str | None

    @classmethod
    def abort(cls, rid: str, error: str | None = None) -> TokenChunk:
        """A chunk that ends `rid` here, not from the scheduler: finish_reason "abort", no tokens, and
        `error` (the reader raises it) or None (the sample ends with what it had)."""
        return cls(rid=rid, ids=[], logprobs=None, top_ids=None, top_logprobs=None, finish_reason="abort",
                   matched_stop=None, prompt_tokens=None, completion_tokens=None, cached_tokens=None,
                   error=error)


def _item(lst: list[Any], i: int) -> Any:
    return lst[i] if i < len(lst) else None


def _own(a: np.ndarray | None) -> np.ndarray | None:
    return a.copy() if a is not None and a.base is not None else a


def _detach(chunks: list[TokenChunk]) -> None:
    """Give `chunks`' logprob arrays their own memory.

    `_dispatch` slices them out of the received batch's arrays, which are views of the ZeroMQ frame
    (protocol.decode: np.frombuffer), so each pending chunk keeps the whole pass's frame alive: every
    request's logprobs of that pass. A stream whose client does not read would otherwise hold a
    frame per pass (at 256 requests x top_logprobs 20, ~40 KB per pass instead of its own ~160 B).
    Called only for an Inbox whose reader is _DETACH_EVERY chunks behind, so a reader that keeps up
    pays no copy.
    """
    for c in chunks:
        c.logprobs, c.top_ids, c.top_logprobs = _own(c.logprobs), _own(c.top_ids), _own(c.top_logprobs)


class Inbox:
    """What the receive loop delivered to one request and its reader has not taken yet.

    Cheaper than an asyncio.Queue, and `take` returns everything pending at once (one task wake-up for
    any number of chunks). One reader at a time.
    """

    __slots__ = ("items", "_waiter")

    def __init__(self) -> None:
        self.items: list[TokenChunk] = []
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, chunk: TokenChunk) -> None:
        self.items.append(chunk)
        if len(self.items) % _DETACH_EVERY == 0:  # a reader this far behind: stop pinning frames
            _detach(self.items[-_DETACH_EVERY:])
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def get_nowait(self) -> TokenChunk:
        """The oldest pending chunk. Raises asyncio.QueueEmpty when there is none."""
        if not self.items:
            raise asyncio.QueueEmpty
        return self.items.pop(0)

    def empty(self) -> bool:
        return not self.items

    async def take(self) -> list[TokenChunk]:
        """Every pending chunk, oldest first; waits while there is none."""
        while not self.items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self.items = self.items, []
        return items


class TokenizerManager:
    """Sends GenerateReq/AbortReq/ControlReq and routes TokenOutBatch/ControlResp back to waiters."""

    def __init__(self, addrs: IpcAddresses, max_inflight: int) -> None:
        self.addrs = addrs
        self.max_inflight = max_inflight
        self._sync_ctx = zmq.Context()
        self._actx = zmq.asyncio.Context()
        self._sender: Sender | None = None
        self._pull: zmq.asyncio.Socket | None = None
        self._queues: dict[str, Inbox] = {}
        self._controls: dict[str, asyncio.Future[protocol.ControlResp]] = {}
        self._recv_task: asyncio.Task[None] | None = None
        self._num_layout_errors = 0
        self.closing = False  # shutting down: no new requests (in-flight ones may still finish)
        self._closed = False  # sockets closed

    # ----------------------------------------------------------------- lifecycle
    def bind(self) -> None:
        """Bind the PULL socket and connect the PUSH socket (no event loop needed)."""
        self._pull = self._actx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.bind(self.addrs.tokenizer_in)
        self._sender = Sender(self._sync_ctx, self.addrs.scheduler_in)

    def start(self) -> None:
        """Start the receive loop on the running event loop (binds first if needed)."""
        if self._pull is None:
            self.bind()
        if self._recv_task is None:
            self._recv_task = asyncio.get_running_loop().create_task(self._recv_loop())

    async def close(self) -> None:
        self.closing = self._closed = True
        if self._recv_task is not None:
            self._recv_task.cancel()
            try:
                await self._recv_task
            except (asyncio.CancelledError, Exception):
                pass
            self._recv_task = None
        for fut in self._controls.values():
            if not fut.done():
                fut.cancel()
        if self._pull is not None:
            self._pull.close(linger=0)
        if self._sender is not None:
            self._sender.sock.close(linger=200)
        self._actx.term()
        self._sync_ctx.term()

    # ----------------------------------------------------------------- requests
    @property
    def num_inflight(self) -> int:
        return len(self._queues)

    def has_capacity(self, num_new: int) -> bool:
        return len(self._queues) + num_new <= self.max_inflight

    def submit(self, req: protocol.GenerateReq, queue: Inbox) -> None:
        """Register `req.rid` -> queue, then send the request to the scheduler."""
        assert self._sender is not None, "manager not bound"
        self._queues[req.rid] = queue
        self._sender.send(req)

    def abort(self, rid: str, reason: str = "abort") -> None:
        """Tell the scheduler to stop `rid` and forget it (later chunks for it are dropped)."""
        if self._queues.pop(rid, None) is not None and self._sender is not None and not self._closed:
            self._sender.send(protocol.AbortReq(rid=rid, reason=reason))

    def release(self, rid: str) -> None:
        """Forget a finished `rid` (no abort sent)."""
        self._queues.pop(rid, None)

    def fail_all(self, error: str = SHUTDOWN_ERROR) -> int:
        """End every in-flight sample with `error` (as if the scheduler had rejected it); returns how many.

        Used on shutdown: each waiting handler raises the matching APIError, so a stream ends with an SSE
        error event and `[DONE]` and a non-streamed request gets its status, instead of a cut connection.
        """
        for rid, inbox in list(self._queues.items()):
            inbox.put_nowait(TokenChunk.abort(rid, error))
        return len(self._queues)

    async def control(self, kind: str, timeout_s: float = 10.0) -> protocol.ControlResp:
        """Send a ControlReq and wait for its ControlResp.

        Raises:
            TimeoutError: no answer within `timeout_s`.
        """
        assert self._sender is not None, "manager not bound"
        req_id = uuid.uuid4().hex
        fut: asyncio.Future[protocol.ControlResp] = asyncio.get_running_loop().create_future()
        self._controls[req_id] = fut
        try:
            self._sender.send(protocol.ControlReq(kind=kind, req_id=req_id))
            return await asyncio.wait_for(fut, timeout_s)
        finally:
            self._controls.pop(req_id, None)

    # ----------------------------------------------------------------- receive loop
    async def _recv_loop(self) -> None:
        pull = self._pull
        assert pull is not None
        while True:
            self._handle(await pull.recv_multipart())
            # Everything already queued is handled before any request task runs: a request that is
            # behind then gets several passes' tokens in one wake-up (and one SSE write).
            for _ in range(_DRAIN_MAX):
                try:
                    frames = await pull.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._handle(frames)

    def _handle(self, frames: list[bytes]) -> None:
        try:
            msg = protocol.decode(frames, protocol.SCHEDULER_TO_TOKENIZER)
        except protocol.ProtocolError as e:
            logger.error("dropping malformed message from scheduler: %s", e)
            return
        try:
            if isinstance(msg, protocol.ControlResp):
                fut = self._controls.get(msg.req_id)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            else:
                self._dispatch(msg)
        except Exception:  # a bug here must not kill the loop for every other request
            logger.exception("error dispatching %s", type(msg).__name__)

    def _dispatch(self, batch: protocol.TokenOutBatch) -> None:
        """Split a batch per rid and enqueue each slice on its request's queue.

        Logprobs are used only when laid out as TokenOutBatch documents (one per output token of each
        request whose top_logprobs_nums entry is >= 0, in request order; top rows of that k); a batch
        that does not add up loses its logprobs, not its tokens.
        """
        offsets = batch.offsets.tolist()
        rids = batch.rids
        out_ids = batch.output_ids.tolist()
        queues = self._queues
        n = len(rids)
        if not batch.logprobs.size and not batch.top_logprob_ids.size:  # the common case: no logprobs
            fr, ms, pt, ct, cached, errs = (batch.finish_reasons, batch.matched_stop, batch.prompt_tokens,
                                            batch.completion_tokens, batch.cached_tokens, batch.errors)
            full = len(fr) == len(ms) == len(pt) == len(ct) == len(cached) == len(errs) == n
            for i, rid in enumerate(rids):
                queue = queues.get(rid)
                if queue is None:
                    continue
                if full:
                    queue.put_nowait(TokenChunk(rid, out_ids[offsets[i]:offsets[i + 1]], None, None, None,
                                                fr[i], ms[i], pt[i], ct[i], cached[i], errs[i]))
                else:
                    queue.put_nowait(TokenChunk(
                        rid, out_ids[offsets[i]:offsets[i + 1]], None, None, None, _item(fr, i), _item(ms, i),
                        _item(pt, i), _item(ct, i), _item(cached, i), _item(errs, i)))
            return
        lens = [offsets[i + 1] - offsets[i] for i in range(n)]
        asked = [(_item(batch.top_logprobs_nums, i) or 0) >= 0 for i in range(n)]  # -1: did not ask
        ks = [max(0, _item(batch.top_logprobs_nums, i) or 0) for i in range(n)]  # as the batch says
        n_lp = sum(m for m, a in zip(lens, asked, strict=True) if a)
        has_lp = batch.logprobs.size == n_lp and batch.logprobs.size > 0
        top_ok = sum(m * k for m, k in zip(lens, ks, strict=True)) == batch.top_logprob_ids.size
        if not top_ok or (batch.logprobs.size and not has_lp):
            self._num_layout_errors += 1
            (logger.warning if self._num_layout_errors == 1 else logger.debug)(
                "TokenOutBatch logprob layout does not match the requests' top_logprobs_num; dropping "
                "the logprobs that do not add up (%d batches so far)", self._num_layout_errors)
        top_pos = lp_pos = 0
        for i, rid in enumerate(rids):
            start, m, k = offsets[i], lens[i], ks[i]
            top_ids = top_lps = lps = None
            if k > 0 and top_ok:
                top_ids = batch.top_logprob_ids[top_pos:top_pos + m * k].reshape(m, k)
                top_lps = batch.top_logprobs[top_pos:top_pos + m * k].reshape(m, k)
            top_pos += m * k
            if asked[i]:
                if has_lp:
                    lps = batch.logprobs[lp_pos:lp_pos + m]
                lp_pos += m
            queue = queues.get(rid)
            if queue is None:
                continue
            queue.put_nowait(TokenChunk(
                rid=rid, ids=out_ids[start:start + m],
                logprobs=lps,
                top_ids=top_ids, top_logprobs=top_lps,
                finish_reason=_item(batch.finish_reasons, i), matched_stop=_item(batch.matched_stop, i),
                prompt_tokens=_item(batch.prompt_tokens, i),
                completion_tokens=_item(batch.completion_tokens, i),
                cached_tokens=_item(batch.cached_tokens, i), error=_item(batch.errors, i)))
