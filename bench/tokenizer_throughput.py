"""Throughput of the tokenizer process alone: the real HTTP front end against a fake scheduler.

Three processes, none of them a model:

- the **tokenizer process**, started exactly as the launcher starts it (`python -m radixrt.child
  tokenizer`, JSON spec on stdin, Ready on the launcher channel), with the default model's tokenizer
  so that detokenization is real;
- a **fake scheduler** (this file, `--role fake-scheduler`) that answers every GenerateReq the way
  the real one streams: one TokenOutBatch per "forward pass" every `--pass-ms`, carrying one new token
  for every running request (English text with some multi-byte characters, cycled), `finish_reason
  "length"` at `max_tokens`;
- the **client**: `--streams` concurrent streaming `/v1/completions` requests (`stream`,
  `include_usage`, `return_token_ids`, `ignore_eos`), `--output-len` tokens each, `--rounds` requests
  per stream. `--client httpx` is bench/serving.py's request code over httpx (its `transport="httpx"`,
  the client of the H200 runs before 2026-12-02); `--client raw` is a minimal asyncio socket client,
  cheap enough that the server side is what is measured (bench/serving.py's default transport is
  now one like it).

Reported: offered rate (streams / pass), delivered output tok/s, tokens per SSE chunk, client-side ITL
(gap between chunks that carry tokens) p50/p99/max, TPOT, and CPU seconds per 1000 tokens (and ms
per request) of the tokenizer process, the client and the fake scheduler (from /proc, over the
measured window: the client run after its warm-up request).

`--burst` reproduces a burst as bench/serving_goals.py's `shared-prefix` sends one: each round
sends all `--streams` requests at once, the fake scheduler holds them until all have arrived and then
runs them as one batch, so that they all finish in the same pass. It adds two wall times per round
(medians over the rounds): `burst_start` (from the sends to the scheduler holding the last request:
the front end's admission of the burst) and `burst_end` (from the pass that finished every request to
the client seeing the last stream end: the front end's finishing of the burst).

`--client-only` measures the client by itself: the same client against a trivial SSE server (this
file, `--role sse-server`, raw asyncio) that sends the same kind of events in lockstep every pass.
If the client alone cannot reach the offered rate, a run against the real server says nothing about
the server.

On a machine with two or more cores, the tokenizer process (or the trivial server) is pinned to core 0
and the client and the fake scheduler to the others (`--no-pin` turns this off).

    .venv/bin/python bench/tokenizer_throughput.py --streams 32 --pass-ms 7 --output-len 256
    .venv/bin/python bench/tokenizer_throughput.py --client-only --client httpx --streams 32 --pass-ms 2
    .venv/bin/python bench/tokenizer_throughput.py --sweep-pass-ms 8,4,2,1 --streams 32 --client raw
    .venv/bin/python bench/tokenizer_throughput.py --profile /tmp/tok.prof   # cProfile of the front end
    .venv/bin/python bench/tokenizer_throughput.py --burst --streams 128 --prompt-len 2176 --output-len 64 \
        --pass-ms 11 --rounds 4   # shared-prefix's burst

`--profile` profiles the tokenizer process over the measured window only (the client run after the
warm-up request; start-up and imports are left out): a sitecustomize probe enables cProfile on
SIGUSR1 and writes the stats on SIGUSR2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "SmolLM2-135M-Instruct"
_TEXT = ("The quick brown fox jumps over the lazy dog while the scheduler streams tokens to every "
         "client. Caching prefixes in a radix tree saves work: 世界 and ünïcödé text, emoji 😀🚀 too. "
         "Numbers like 3.14159 and 2,718 appear, and code such as `for i in range(10): print(i)`. ")


# sitecustomize for --gc-stats: every collection of the tokenizer process as "wall_time gen ms" lines
_GC_PROBE = """
import atexit, gc, os, time
_t = [0.0]
_rows = []
def _cb(phase, info):
    if phase == "start":
        _t[0] = time.perf_counter()
    else:
        _rows.append((time.time(), info["generation"], (time.perf_counter() - _t[0]) * 1000))
gc.callbacks.append(_cb)
def _dump():
    with open(os.environ["GC_PROBE_OUT"], "w") as f:
        f.writelines(f"{t:.6f} {g} {ms:.3f}\\n" for t, g, ms in _rows)
atexit.register(_dump)
"""


# sitecustomize for --profile: cProfile of the tokenizer process between SIGUSR1 and SIGUSR2 (stats
# written to PROFILE_PROBE_OUT on SIGUSR2)
_PROFILE_PROBE = """
import cProfile, os, signal
_prof = cProfile.Profile()
def _on(*_):
    _prof.enable()
def _off(*_):
    _prof.disable()
    _prof.dump_stats(os.environ["PROFILE_PROBE_OUT"] + ".tmp")
    os.replace(os.environ["PROFILE_PROBE_OUT"] + ".tmp", os.environ["PROFILE_PROBE_OUT"])
signal.signal(signal.SIGUSR1, _on)
signal.signal(signal.SIGUSR2, _off)
"""


def _gc_summary(path: Path, t0: float, t1: float) -> dict[str, Any]:
    """Collections of the tokenizer process within [t0, t1]: count, total and max ms per generation."""
    out: dict[str, Any] = {}
    if not path.exists():
        return {"gc": "no data"}
    rows = [line.split() for line in path.read_text().splitlines()]
    for gen in (0, 1, 2):
        ms = [float(r[2]) for r in rows if int(r[1]) == gen and t0 <= float(r[0]) <= t1]
        out[f"gc{gen}"] = f"{len(ms)}x/{sum(ms):.0f}ms/max{max(ms, default=0):.1f}ms"
    return out


def _clk_tck() -> int:
    return os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (all threads), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / _clk_tck()


def thread_run_s(pid: int) -> float:
    """Time the main thread of `pid` (the tokenizer process's event loop) has run on a CPU, seconds
    (/proc/<pid>/schedstat: nanoseconds, not clock ticks; 0.0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _pin(pid: int, cpus: set[int]) -> None:
    try:
        os.sched_setaffinity(pid, cpus)
    except (AttributeError, OSError):
        pass


# ============================================================================ fake scheduler
def _take_messages(msgs: list[Any], live: dict[str, list[int]], tx: Any, stream_len: int,
                   rng: np.random.Generator, gang: _Gang) -> None:
    """Admit GenerateReqs into `live` (rid -> [position in stream, sent, max tokens, prompt len]; or
    into the gang's waiting room), drop aborted rids, answer control requests."""
    from radixrt import protocol

    for msg in msgs:
        if isinstance(msg, protocol.GenerateReq):
            mnt = msg.sampling.get("max_new_tokens") or 16
            gang.hold(live)[msg.rid] = [int(rng.integers(stream_len)), 0, int(mnt), len(msg.input_ids)]
        elif isinstance(msg, protocol.AbortReq):
            live.pop(msg.rid, None)
            gang.waiting.pop(msg.rid, None)
        elif isinstance(msg, protocol.ControlReq):
            tx.send(protocol.ControlResp(req_id=msg.req_id, ok=True,
                                         data={"scheduler": {"num_running_reqs": len(live)}}))


def _one_pass(live: dict[str, list[int]], stream: np.ndarray) -> Any:
    """One token for every live request as a TokenOutBatch; finished requests leave `live`."""
    from radixrt import protocol

    rids = list(live)
    out = protocol.TokenOutBatch(rids=rids)
    ids = np.empty(len(rids), np.int32)
    for i, rid in enumerate(rids):
        st = live[rid]
        ids[i] = stream[st[0] % len(stream)]
        st[0] += 1
        st[1] += 1
        done = st[1] >= st[2]
        out.finish_reasons.append("length" if done else None)
        out.matched_stop.append(None)
        out.prompt_tokens.append(st[3])
        out.completion_tokens.append(st[1])
        out.cached_tokens.append(0)
        out.errors.append(None)
        if done:
            del live[rid]
    out.offsets = np.arange(len(rids) + 1, dtype=np.int32)
    out.output_ids = ids
    return out


class _Gang:
    """--burst: GenerateReqs wait until `size` have arrived, then run their passes together and finish
    in the same pass (as a real scheduler's batch does when its requests arrive at once). A partial
    gang (the warm-up request) is admitted once no request has arrived for GANG_WAIT_S (a slow burst
    keeps its gang: its requests keep arriving). Records, per full gang, the perf_counter
    times of the last arrival and of the pass that finished it (CLOCK_MONOTONIC: the client's clock)."""

    GANG_WAIT_S = 0.5

    def __init__(self, size: int, pid_file: str) -> None:
        self.size = size
        self.pid_file = pid_file
        self.waiting: dict[str, list[int]] = {}
        self.last_s = 0.0  # when the last request joined the waiting room
        # per full gang: [last arrival, final pass sent] as perf_counter, then the tokenizer process's
        # event-loop run time (thread_run_s) at the same two moments
        self.times: list[list[float]] = []

    def _tokenizer_run_s(self) -> float:
        try:
            return thread_run_s(int(Path(self.pid_file).read_text()))
        except (OSError, ValueError):
            return 0.0

    def hold(self, live: dict[str, list[int]]) -> dict[str, list[int]]:
        """Where a new request goes: `live` when no gang is formed, else the waiting room."""
        if self.size <= 0:
            return live
        self.last_s = time.perf_counter()
        return self.waiting

    def admit(self, live: dict[str, list[int]]) -> bool:
        """Move a full (or timed-out) gang into `live`; True when one moved."""
        full = len(self.waiting) >= self.size > 0
        if not self.waiting or not (full or time.perf_counter() - self.last_s > self.GANG_WAIT_S):
            return False
        live.update(self.waiting)
        self.waiting.clear()
        if full:
            self.times.append([time.perf_counter(), 0.0, self._tokenizer_run_s(), 0.0])
        return True

    def finished(self, live: dict[str, list[int]]) -> None:
        if self.times and not live and not self.times[-1][1]:
            self.times[-1][1] = time.perf_counter()
            self.times[-1][3] = self._tokenizer_run_s()


def run_fake_scheduler(spec: dict[str, Any]) -> None:
    """Bind scheduler_in, stream one token per live request every pass_s, until SIGTERM."""
    import zmq

    from radixrt import protocol
    from radixrt.ipc import IpcAddresses, Receiver, Sender

    addrs = IpcAddresses.from_dict(spec["addrs"])
    pass_s = float(spec["pass_s"])
    stream = np.asarray(spec["token_stream"], np.int32)
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    ctx = zmq.Context()
    rx = Receiver(ctx, addrs.scheduler_in, protocol.TOKENIZER_TO_SCHEDULER)
    tx = Sender(ctx, addrs.tokenizer_in)
    # rid -> [position in stream, tokens sent, max tokens, prompt len]
    live: dict[str, list[int]] = {}
    rng = np.random.default_rng(0)
    next_t = time.perf_counter()
    gang = _Gang(int(spec.get("gang", 0)), spec.get("tokenizer_pid_file", ""))
    passes = late = 0
    while not stop[0]:
        wait_ms = max(0.0, (next_t - time.perf_counter()) * 1000)
        if rx.sock.poll(int(wait_ms) if wait_ms >= 1 else (1 if wait_ms > 0 else 0)):
            _take_messages(rx.recv_all(), live, tx, len(stream), rng, gang)
            if gang.admit(live):
                next_t = time.perf_counter() + pass_s  # the first pass (the extend) starts now
            continue
        if gang.admit(live):
            next_t = time.perf_counter() + pass_s
        now = time.perf_counter()
        if now < next_t:
            continue
        next_t += pass_s
        if next_t < now:  # a late pass does not make the next ones come faster (a GPU would not)
            late += 1
            next_t = now + pass_s
        if not live:
            continue
        passes += 1
        tx.send(_one_pass(live, stream))
        gang.finished(live)
    print(json.dumps({"passes": passes, "late_passes": late, "gangs": gang.times}), flush=True)
    rx.sock.close()
    tx.sock.close(linger=0)
    ctx.term()


# ============================================================================ trivial SSE server
def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _sse_step(st: list[Any], stream: list[int], texts: list[str]) -> tuple[bytes, bool]:
    """The next token event of stream state st = [writer, id, sent, max_tokens, pos, done future] as
    one HTTP chunk (the finish event, usage and [DONE] too, ending the body, once it is done)."""
    _, rid, _, mx, pos = st[:5]
    st[2] += 1
    st[4] += 1
    ev = {"id": f"cmpl-{rid}", "object": "text_completion", "created": 0, "model": MODEL,
          "choices": [{"index": 0, "text": texts[pos % len(stream)], "logprobs": None,
                       "finish_reason": None, "token_ids": [stream[pos % len(stream)]]}], "usage": None}
    data = b"data: " + orjson.dumps(ev) + b"\n\n"
    if st[2] < mx:
        return _chunk(data), False
    ev["choices"] = [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length", "token_ids": []}]
    data += b"data: " + orjson.dumps(ev) + b"\n\n"
    ev["choices"] = []
    ev["usage"] = {"prompt_tokens": 8, "completion_tokens": mx, "total_tokens": mx + 8,
                   "prompt_tokens_details": {"cached_tokens": 0}}
    data += b"data: " + orjson.dumps(ev) + b"\n\ndata: [DONE]\n\n"
    return _chunk(data) + b"0\r\n\r\n", True


def run_sse_server(spec: dict[str, Any]) -> None:
    """A minimal HTTP/1.1 SSE server: every live stream gets one event per pass, in lockstep."""
    import uvloop

    pass_s = float(spec["pass_s"])
    port = int(spec["port"])
    stream = spec["token_stream"]
    texts = spec["token_texts"]

    async def main() -> None:
        live: list[list[Any]] = []  # [writer, id, sent, max_tokens, pos]

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = orjson.loads(await reader.readexactly(length)) if length else {}
                if head.startswith(b"GET"):
                    payload = orjson.dumps({"object": "list", "data": [{"id": MODEL}]})
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
                    continue
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                done = asyncio.get_running_loop().create_future()
                live.append([writer, os.urandom(8).hex(), 0, int(body.get("max_tokens", 16)),
                             hash(os.urandom(4)) % len(stream), done])
                await done

        async def ticker() -> None:
            next_t = time.perf_counter()
            while True:
                next_t += pass_s
                delay = next_t - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    next_t = time.perf_counter()
                for st in list(live):
                    data, done = _sse_step(st, stream, texts)
                    st[0].write(data)
                    if done:
                        live.remove(st)
                        st[5].set_result(None)

        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        asyncio.get_running_loop().create_task(ticker())
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    uvloop.run(main())


# ============================================================================ clients
@dataclass
class StreamResult:
    ok: bool = True
    error: str | None = None
    tokens: int = 0
    chunks: int = 0
    usage_tokens: int | None = None
    start_s: float = 0.0
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)


async def _raw_request(host: str, port: int, body: bytes, conn: Any = None) -> StreamResult:
    """One streamed completion over a fresh connection, or over `conn` ((reader, writer), kept open:
    keep-alive); parses each event with orjson."""
    res = StreamResult(start_s=time.perf_counter())
    reader, writer = conn if conn is not None else await asyncio.open_connection(host, port)
    close = b"" if conn is not None else b"connection: close\r\n"
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: " + str(len(body)).encode() + b"\r\n" + close + b"\r\n" + body)
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            res.ok, res.error = False, head.split(b"\r\n",
                                                  1)[0].decode() + " " + (await reader.read()).decode()[:300]
            return res
        chunked = b"transfer-encoding: chunked" in head.lower()
        buf = b""
        last = 0.0
        finished = False
        while not finished:
            if chunked:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.strip(), 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")  # the blank line after the last chunk
                    break
                data = await reader.readexactly(size + 2)
                buf += data[:-2]
            else:
                data = await reader.read(65536)
                if not data:
                    break
                buf += data
            now = time.perf_counter()
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                if not ev.startswith(b"data: "):
                    continue
                payload = ev[6:]
                if payload == b"[DONE]":
                    finished = conn is None  # keep-alive: read on to the last chunk
                    break
                obj = orjson.loads(payload)
                if "error" in obj:
                    res.ok, res.error = False, str(obj["error"])
                    continue
                for ch in obj.get("choices") or ():
                    n = len(ch.get("token_ids") or ())
                    if not n:
                        continue
                    res.tokens += n
                    res.chunks += 1
                    if res.ttft_s is None:
                        res.ttft_s = now - res.start_s
                    else:
                        res.itl_s.append(now - last)
                    last = now
                if obj.get("usage"):
                    res.usage_tokens = obj["usage"]["completion_tokens"]
        res.e2e_s = time.perf_counter() - res.start_s
    finally:
        if conn is None:
            writer.close()
    return res


async def _httpx_request(client: Any, cfg: Any, prompt: list[int], output_len: int) -> StreamResult:
    from bench.serving import RequestOutcome, send_request

    out = RequestOutcome(0, 0, len(prompt), output_len)
    out.chunk_times_s = []
    await send_request(client, cfg, MODEL, out, prompt)
    res = StreamResult(ok=out.ok, error=out.error, tokens=out.stream_tokens, chunks=len(out.chunk_times_s),
                       usage_tokens=out.usage_completion_tokens, start_s=out.start_s, ttft_s=out.ttft_s,
                       e2e_s=out.e2e_s, itl_s=out.itl_s)
    return res


def _body(prompt: list[int], output_len: int) -> bytes:
    return orjson.dumps({"model": MODEL, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
                         "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
                         "return_token_ids": True})


async def drive(port: int, client_kind: str, streams: int, rounds: int, output_len: int,
                prompt_len: int, on_start: Any = None, bursts: list[list[float]] | None = None,
                server_pid: int = 0, keep_alive: bool = False) -> tuple[list[StreamResult], float]:
    """`streams` workers, each sending `rounds` requests one after the other; (results, duration_s).

    With `bursts` (a list to fill; --burst, raw client), each round instead sends all `streams`
    requests at once (bodies encoded beforehand) and waits for every one of them; per round it
    appends [perf_counter at the sends, perf_counter when the last stream ended], then the server's
    event-loop run time (thread_run_s of `server_pid`) at the same two moments. With `keep_alive`
    each round's requests go over connections opened before its clock (one each), closed after.
    `on_start()` runs after the warm-up request, just before the measured requests start."""
    rng = np.random.default_rng(1)
    results: list[StreamResult] = []
    client = cfg = None
    if client_kind == "httpx":
        from bench.serving import BenchConfig, _make_client

        cfg = BenchConfig(base_url=f"http://127.0.0.1:{port}", model=MODEL, timeout_s=120, transport="httpx")
        client = _make_client(cfg)

    async def one(prompt: list[int]) -> StreamResult:
        if client is not None:
            return await _httpx_request(client, cfg, prompt, output_len)
        return await _raw_request("127.0.0.1", port, _body(prompt, output_len))

    async def worker() -> None:
        for _ in range(rounds):
            prompt = rng.integers(100, 40000, size=prompt_len).tolist()
            results.append(await one(prompt))

    async def burst() -> None:
        assert bursts is not None
        for _ in range(rounds):
            bodies = [_body(rng.integers(100, 40000, size=prompt_len).tolist(), output_len)
                      for _ in range(streams)]
            conns = [None] * streams
            if keep_alive:  # opened (and accepted) before the clock, as bench/serving.py's pool
                conns = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port)
                                               for _ in range(streams)))
                await asyncio.sleep(0.05)
            run0, t_send = thread_run_s(server_pid), time.perf_counter()
            done = await asyncio.gather(*(_raw_request("127.0.0.1", port, b, c)
                                          for b, c in zip(bodies, conns, strict=True)))
            for c in conns:
                if c is not None:
                    c[1].close()
            run1 = thread_run_s(server_pid)
            results.extend(done)
            bursts.append([t_send, max(r.start_s + (r.e2e_s or 0.0) for r in done), run0, run1])

    await one([1, 2, 3])  # warm-up (connection, first-request imports)
    if on_start is not None:
        on_start()
    t0 = time.perf_counter()
    if bursts is not None:
        await burst()
    else:
        await asyncio.gather(*(worker() for _ in range(streams)))
    duration = time.perf_counter() - t0
    if client is not None:
        await client.aclose()
    return results, duration


def summarize(results: list[StreamResult], duration_s: float, streams: int, pass_ms: float,
              cpu: dict[str, float]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    tokens = sum(r.tokens for r in ok)
    chunks = sum(r.chunks for r in ok)
    itl = np.array([x for r in ok for x in r.itl_s]) * 1000 if ok else np.zeros(0)
    tpot = [(r.e2e_s - r.ttft_s) / (r.tokens - 1) * 1000 for r in ok if r.ttft_s is not None and r.tokens > 1]

    def pct(q: float) -> float | None:
        return float(np.percentile(itl, q)) if itl.size else None

    out = {
        "streams": streams, "pass_ms": pass_ms, "offered_tok_s": streams * 1000.0 / pass_ms,
        "delivered_tok_s": tokens / duration_s if duration_s else 0.0,
        "requests": len(results), "failed": len(results) - len(ok),
        "errors": [r.error for r in results if not r.ok][:3],
        "usage_mismatches": sum(r.usage_tokens is not None and r.usage_tokens != r.tokens for r in ok),
        "tokens": tokens, "tokens_per_chunk": tokens / chunks if chunks else 0.0,
        "itl_p50_ms": pct(50), "itl_p90_ms": pct(90), "itl_p99_ms": pct(99),
        "itl_max_ms": float(itl.max()) if itl.size else None,
        "tpot_mean_ms": float(np.mean(tpot)) if tpot else None, "duration_s": duration_s,
        # what the streams got while running (excludes the gaps between one request and the next)
        "stream_tok_s": streams * 1000.0 / float(np.mean(tpot)) if tpot else None,
    }
    for name, sec in cpu.items():
        out[f"cpu_{name}_s"] = sec
        out[f"cpu_{name}_ms_per_1k_tok"] = sec / tokens * 1e6 if tokens else None
        out[f"cpu_{name}_util"] = sec / duration_s if duration_s else None
        out[f"cpu_{name}_ms_per_req"] = sec / len(results) * 1000 if results else None
    return out


# ============================================================================ orchestration
def _spawn_role(role: str, spec: dict[str, Any], log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, __file__, "--role", role], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log.open("ab"), text=True)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(spec))
    proc.stdin.close()
    return proc


def _token_stream(tokenizer: Any) -> list[int]:
    return list(tokenizer.encode(_TEXT * 4, add_special_tokens=False))


def _stop(proc: subprocess.Popen, timeout: float = 20) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.stdout.read() if proc.stdout else ""


def _spawn_tokenizer(args: argparse.Namespace, sargs: Any, addrs: Any, model_dir: Path, gc_out: Path,
                     log: Path) -> subprocess.Popen:
    """The real tokenizer process (radixrt.child), optionally with the cProfile or GC probe."""
    cmd = [sys.executable, "-m", "radixrt.child", "tokenizer"]
    spec = {"args": sargs.to_dict(), "addrs": addrs.to_dict(), "model_dir": str(model_dir),
            "extra": {"worker_info": {"context_length": 8192}}}
    env = {**os.environ, **dict(kv.split("=", 1) for kv in args.server_env)}
    probes = ([_GC_PROBE] if args.gc_stats else []) + ([_PROFILE_PROBE] if args.profile else [])
    if probes:
        probe_dir = Path(addrs.dir) / "probe"
        probe_dir.mkdir()
        (probe_dir / "sitecustomize.py").write_text("\n".join(probes))
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(probe_dir), env.get("PYTHONPATH")) if x)
        env["GC_PROBE_OUT"] = str(gc_out)
        if args.profile:
            env["PROFILE_PROBE_OUT"] = str(Path(args.profile).resolve())
    tok = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                           env=env)
    assert tok.stdin is not None
    tok.stdin.write(orjson.dumps(spec))
    tok.stdin.close()
    return tok


def _measure(args: argparse.Namespace, port: int, tok: subprocess.Popen,
             sched: subprocess.Popen, bursts: list[list[float]] | None = None,
             ) -> tuple[Any, float, dict[str, float], tuple[float, float]]:
    """The client run: results, duration, CPU seconds per process, and the window's wall times (a
    py-spy profile of the tokenizer process over it with --py-spy). `bursts`: see `drive`."""
    spy = None
    if args.py_spy:
        spy = subprocess.Popen([shutil.which("py-spy") or "py-spy", "record", "-p", str(tok.pid),
                                "-r", "250", "--format", "raw", "-o", args.py_spy],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    pids = {"tokenizer": tok.pid, "client": os.getpid(), "fake_scheduler": sched.pid}
    cpu0: dict[str, float] = {}
    t_start = [0.0]

    def start() -> None:  # after the warm-up request: the window leaves first-request costs out
        if args.profile:
            tok.send_signal(signal.SIGUSR1)
        cpu0.update({k: proc_cpu_s(pid) for k, pid in pids.items()})
        t_start[0] = time.time()

    results, duration = asyncio.run(drive(port, args.client, args.streams, args.rounds, args.output_len,
                                          args.prompt_len, on_start=start, bursts=bursts,
                                          server_pid=tok.pid, keep_alive=args.keep_alive))
    t_end = time.time()
    cpu = {k: proc_cpu_s(pid) - cpu0[k] for k, pid in pids.items()}
    if args.profile:
        out = Path(args.profile)
        out.unlink(missing_ok=True)
        tok.send_signal(signal.SIGUSR2)
        deadline = time.time() + 60
        while not out.exists() and time.time() < deadline:
            time.sleep(0.05)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(30)
    return results, duration, cpu, (t_start[0], t_end)


def run_server_case(args: argparse.Namespace, pass_ms: float, model_dir: Path, tokenizer: Any) -> dict:
    import zmq

    from radixrt import protocol
    from radixrt.config import ServerArgs
    from radixrt.ipc import IpcAddresses, Receiver
    from tests.tokenizer_proc.fakes import free_port

    log = Path(args.log)
    addrs = IpcAddresses.create()
    zctx = zmq.Context()
    launcher = Receiver(zctx, addrs.launcher_in, protocol.CHILD_TO_LAUNCHER)
    port = free_port()
    sargs = ServerArgs(port=port, max_running_requests=max(64, args.streams), log_level="warning")
    sched = _spawn_role("fake-scheduler", {"addrs": addrs.to_dict(), "pass_s": pass_ms / 1000,
                                           "token_stream": _token_stream(tokenizer),
                                           "gang": args.streams if args.burst else 0,
                                           "tokenizer_pid_file": str(Path(addrs.dir) / "tokenizer.pid")},
                        log)
    bursts: list[list[float]] | None = [] if args.burst else None
    gc_out = Path(addrs.dir) / "gc.txt"
    tok = _spawn_tokenizer(args, sargs, addrs, model_dir, gc_out, log)
    (Path(addrs.dir) / "tokenizer.pid").write_text(str(tok.pid))
    try:
        msg = launcher.recv(timeout_ms=120_000)
        if not isinstance(msg, protocol.Ready):
            raise RuntimeError(f"tokenizer process did not start: {msg!r} (see {log})")
        if not args.no_pin and (os.cpu_count() or 1) >= 2:
            others = set(range(1, os.cpu_count() or 2))
            _pin(tok.pid, {0})
            _pin(sched.pid, others)
            _pin(0, others)
        results, duration, cpu, (t_start, t_end) = _measure(args, port, tok, sched, bursts)
        _stop(tok)
        gc_stats = _gc_summary(gc_out, t_start, t_end) if args.gc_stats else {}
    finally:
        _stop(tok)
        sched_out = _stop(sched)
        launcher.sock.close()
        zctx.term()
        addrs.cleanup()
    out = summarize(results, duration, args.streams, pass_ms, cpu)
    out["mode"] = f"server/{args.client}"
    out.update(gc_stats)
    try:
        out.update(json.loads(sched_out.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        pass
    if bursts is not None:
        out.update(burst_timings(bursts, out.pop("gangs", [])))
    return out


def burst_timings(bursts: list[list[float]], gangs: list[list[float]]) -> dict[str, Any]:
    """Per --burst round, medians: `burst_start_ms`, from the client's sends to the fake scheduler
    holding the last of the round's requests; `burst_end_ms`, from the scheduler's pass that finished
    them all to the client seeing the last stream end; `*_cpu_ms`, the time the tokenizer process's
    event loop ran on a CPU in the same windows (what contention from other processes disturbs
    less than the wall times)."""
    gangs = gangs[-len(bursts):] if len(gangs) >= len(bursts) else []
    if not gangs:
        return {"burst_start_ms": None, "burst_end_ms": None}
    pairs = list(zip(bursts, gangs, strict=True))

    def med(xs: list[float]) -> float:
        return float(np.median(xs)) * 1000

    return {"burst_start_ms": med([g[0] - b[0] for b, g in pairs]),
            "burst_end_ms": med([b[1] - g[1] for b, g in pairs]),
            "burst_start_cpu_ms": med([g[2] - b[2] for b, g in pairs]),
            "burst_end_cpu_ms": med([b[3] - g[3] for b, g in pairs])}


def run_client_only_case(args: argparse.Namespace, pass_ms: float, tokenizer: Any) -> dict:
    from tests.tokenizer_proc.fakes import free_port

    port = free_port()
    stream = _token_stream(tokenizer)
    texts = [tokenizer.decode([t]) for t in stream]
    srv = _spawn_role("sse-server", {"port": port, "pass_s": pass_ms / 1000, "token_stream": stream,
                                     "token_texts": texts}, Path(args.log))
    try:
        assert srv.stdout is not None
        if srv.stdout.readline().strip() != "ready":
            raise RuntimeError("trivial SSE server did not start")
        if not args.no_pin and (os.cpu_count() or 1) >= 2:
            _pin(srv.pid, {0})
            _pin(0, set(range(1, os.cpu_count() or 2)))
        cpu0 = {"sse_server": proc_cpu_s(srv.pid), "client": proc_cpu_s(os.getpid())}
        results, duration = asyncio.run(drive(port, args.client, args.streams, args.rounds, args.output_len,
                                              args.prompt_len))
        cpu = {k: proc_cpu_s(srv.pid if k == "sse_server" else os.getpid()) - v for k, v in cpu0.items()}
    finally:
        _stop(srv)
    out = summarize(results, duration, args.streams, pass_ms, cpu)
    out["mode"] = f"client-only/{args.client}"
    return out


def format_row(r: dict) -> str:
    def f(v: Any, spec: str = ".1f") -> str:
        return "-" if v is None else format(v, spec)
    extra = "".join(f" {k.removeprefix('cpu_').removesuffix('_ms_per_1k_tok')}={f(r[k], '.0f')}ms/1k-tok"
                    f"({f(r[k.replace('_ms_per_1k_tok', '_util')], '.0%')})"
                    for k in r if k.endswith("_ms_per_1k_tok"))
    return (f"{r['mode']:<20} streams={r['streams']:<3} pass={r['pass_ms']:g}ms "
            f"offered={r['offered_tok_s']:.0f} "
            f"delivered={r['delivered_tok_s']:.0f} tok/s (in-stream {f(r['stream_tok_s'], '.0f')})  "
            f"tok/chunk={r['tokens_per_chunk']:.2f}  "
            f"ITL p50={f(r['itl_p50_ms'], '.2f')} p99={f(r['itl_p99_ms'], '.1f')} "
            f"max={f(r['itl_max_ms'], '.0f')} ms "
            f"TPOT={f(r['tpot_mean_ms'], '.2f')}ms failed={r['failed']}{extra}"
            + (f" tokenizer_cpu={r['cpu_tokenizer_ms_per_req']:.3f}ms/req" if "cpu_tokenizer_ms_per_req" in r
               else "")
            + (f" late_passes={r['late_passes']}" if "late_passes" in r else "")
            + (f" burst_start={f(r['burst_start_ms'])}ms(cpu {f(r.get('burst_start_cpu_ms'))}ms)"
               f" burst_end={f(r['burst_end_ms'])}ms(cpu {f(r.get('burst_end_cpu_ms'))}ms)"
               if "burst_start_ms" in r else "")
            + "".join(f" {k}={r[k]}" for k in ("gc0", "gc1", "gc2") if k in r))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=["fake-scheduler", "sse-server"], help=argparse.SUPPRESS)
    p.add_argument("--streams", type=int, default=32, help="concurrent streaming requests")
    p.add_argument("--pass-ms", type=float, default=7.0, help="fake forward-pass interval")
    p.add_argument("--sweep-pass-ms", default="", help='e.g. "8,4,2": one run per pass interval')
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2, help="requests per stream, one after the other")
    p.add_argument("--client", choices=["httpx", "raw"], default="raw")
    p.add_argument("--burst", action="store_true",
                   help="each round sends all --streams requests at once; the fake scheduler runs them "
                   "as one batch (finishing in one pass); reports the burst's start and end times")
    p.add_argument("--keep-alive", action="store_true",
                   help="--burst: each round's requests go over connections opened before its clock")
    p.add_argument("--client-only", action="store_true", help="the client against a trivial SSE server")
    p.add_argument("--profile", default=None, help="cProfile the tokenizer process into this file")
    p.add_argument("--py-spy", default=None, help="py-spy record (raw/collapsed) of the tokenizer process")
    p.add_argument("--gc-stats", action="store_true", help="count the tokenizer process's GC pauses")
    p.add_argument("--server-env", action="append", default=[], help="KEY=VALUE for the tokenizer process")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--log", default="/tmp/tokenizer_throughput.log")
    p.add_argument("--model-dir", default=None,
                   help="a directory with the tokenizer files (default: the default model's)")
    p.add_argument("--output-json", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.burst and (args.client != "raw" or args.client_only):
        raise SystemExit("--burst runs the raw client against the tokenizer process")
    if args.role == "fake-scheduler":
        run_fake_scheduler(json.loads(sys.stdin.read()))
        return 0
    if args.role == "sse-server":
        run_sse_server(json.loads(sys.stdin.read()))
        return 0

    from radixrt.config import Env
    from radixrt.models.loader import resolve_model_dir
    from radixrt.tokenizer_proc.main import load_tokenizer

    model_dir = (Path(args.model_dir) if args.model_dir
                 else resolve_model_dir(None, Env.read().cache_dir, "auto"))
    tokenizer = load_tokenizer(model_dir)
    levels = [float(x) for x in args.sweep_pass_ms.split(",") if x.strip()] or [args.pass_ms]
    rows = []
    for pass_ms in levels:
        row = (run_client_only_case(args, pass_ms, tokenizer) if args.client_only
               else run_server_case(args, pass_ms, model_dir, tokenizer))
        rows.append(row)
        print(format_row(row), flush=True)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(rows, indent=2))
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
