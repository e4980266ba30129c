"""Serving benchmark: an async load generator against an OpenAI-compatible /v1/completions endpoint.

Every request sends token-id prompts (exact input lengths), greedy, `ignore_eos: true` and
`max_tokens = output_len`, streamed with `stream_options.include_usage`. Sessions (see
bench/workloads.py) start by a Poisson process of `request_rate` sessions/s (or all at once for inf);
at most `max_concurrency` requests are in flight; the turns of a session run one after the other.

Metric definitions (the field's conventions; all latencies in ms):
- TTFT: request sent -> first chunk carrying output.
- ITL: gaps between consecutive chunks carrying output (one gap per chunk, however many tokens it holds).
- TPOT: (e2e - TTFT) / (output_tokens - 1), per request with more than one output token.
- e2e: request sent -> stream closed.
- throughputs (tok/s, req/s) over the run's duration: first request sent -> last request done.
- cache hit rate: sum(usage.prompt_tokens_details.cached_tokens) / sum(usage.prompt_tokens).
Output tokens are counted twice, from the stream and from usage.completion_tokens; every disagreement
is counted and flagged. A chunk counts len(choice.token_ids) if the server sends them (asked with
`return_token_ids`), else len(choice.logprobs.tokens) if present (`--extra-body '{"logprobs": 0}'`), else
1 if it carries text: a server that holds back text of incomplete UTF-8 needs one of the first two.

Transport: completions stream over a minimal asyncio HTTP/1.1 client (`--transport raw`, the default
for http:// URLs) with orjson-encoded bodies, on keep-alive connections opened before the clock starts
(`--connections keep-alive`, the default: one per request that can be in flight at once when that is
known, i.e. `--max-concurrency` or an infinite rate; at a finite rate the pool grows as needed), or on a
fresh connection per request (`--connections close`); `--transport httpx` (and any https:// URL)
goes through httpx, which delayed a burst of 128 2K-token requests by 140-240 ms before any reached
the server (docs/benchmarks.md, "Serving path: pass timelines").

Usage: python bench/serving.py --base-url http://127.0.0.1:30000 --workload random --num-prompts 64
(run with --help for every flag); from Python: run_benchmark(BenchConfig(...)) -> dict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
from tqdm import tqdm

try:
    from .serving_metrics import (  # noqa: F401  (re-exported: the public names of this module)
        LATENCY_KEYS,
        MAX_ERRORS_KEPT,
        RUN_FIELDS,
        STAT_FIELDS,
        RequestOutcome,
        _apply_event,
        format_report,
        latency_stats_ms,
        summarize,
    )
    from .workloads import Session, Workload, WorkloadSpec, add_workload_args, next_prompt, spec_from_args
except ImportError:  # run as a script: python bench/serving.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.serving_metrics import (  # noqa: F401
        LATENCY_KEYS,
        MAX_ERRORS_KEPT,
        RUN_FIELDS,
        STAT_FIELDS,
        RequestOutcome,
        _apply_event,
        format_report,
        latency_stats_ms,
        summarize,
    )
    from bench.workloads import (
        Session,
        Workload,
        WorkloadSpec,
        add_workload_args,
        next_prompt,
        spec_from_args,
    )

try:  # parsing every SSE event is the client's main cost at high concurrency
    from orjson import dumps as _dumps
    from orjson import loads as _loads
except ImportError:
    _loads = json.loads

    def _dumps(obj: object) -> bytes:
        return json.dumps(obj).encode()

_JSON_HEADERS = {"content-type": "application/json"}

SCHEMA_VERSION = 1


@dataclass(slots=True)
class BenchConfig:
    """One benchmark invocation. request_rate in sessions/s (inf: all at once); timeout_s per request."""

    base_url: str = "http://127.0.0.1:30000"
    model: str | None = None  # None: the first id of GET /v1/models
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    request_rate: float = float("inf")
    max_concurrency: int | None = None
    concurrency_sweep: list[int] = field(default_factory=list)  # one run per level; overrides max_concurrency
    sweep_num_prompts: list[int] = field(default_factory=list)  # per sweep level (default: workload's)
    warmup_requests: int = 1  # short requests on unrelated prompts before measuring
    timeout_s: float = 600.0
    api_key: str | None = None
    flush_cache: bool = False  # POST /flush_cache before each run (ignored if the server lacks it)
    output_json: str | None = None
    plot_dir: str | None = None
    disable_tqdm: bool = False
    extra_body: dict = field(default_factory=dict)  # merged into every request body
    request_token_ids: bool = True  # send `return_token_ids` (multi-turn answers, exact token counts)
    # request_rate inf with max_concurrency c: the first c sessions start evenly over ramp_up_s
    # instead of at once. With fixed lengths a closed loop that starts at once stays in lockstep
    # (every request of a wave finishes in the same pass and the next c arrive together), so its
    # TTFT is that of c simultaneous prefills; a ramp of about one request's e2e measures the
    # steady state, where each arrival meets c - 1 decoding requests.
    ramp_up_s: float = 0.0
    # "raw": the completion streams over a minimal asyncio HTTP/1.1 client (_raw_sse; http:// URLs);
    # "httpx": over the httpx client. httpx costs ~1 ms of this process's CPU per request before its
    # bytes leave: a burst of 128 x 2K-token requests reached a no-op server 140-240 ms after the
    # sends began through httpx, 57-73 ms through the raw client (docs/benchmarks.md, 2026-12-02)
    transport: str = "raw"
    # raw transport only. "keep-alive": requests reuse idle HTTP/1.1 connections from a pool opened
    # before the clock starts (max_concurrency connections, else one per session when all start at
    # once; none at a finite rate, where the pool grows as arrivals need it), as a client holding
    # connections to the server does (the openai SDK's httpx pool, a gateway's upstream pool). At most
    # POOL_MAX or half the open-files limit are opened ahead. "close": a fresh connection per request,
    # closed after it (the default until 2026-12-03). With fresh connections the first request of
    # `shared-prefix`'s burst (128 x 2,176 ids) was complete at a no-op server 21 ms after the clock
    # on the 2-vCPU VM (5 ms with keep-alive) and 41 ms on the H200 host (bench/lab/client_burst.py,
    # docs/benchmarks.md).
    connections: str = "keep-alive"

    def __post_init__(self) -> None:
        if self.request_rate <= 0:
            raise ValueError("request_rate must be > 0 (inf for all at once)")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if any(c < 1 for c in self.concurrency_sweep):
            raise ValueError("concurrency sweep levels must be >= 1")
        if self.sweep_num_prompts and len(self.sweep_num_prompts) != len(self.concurrency_sweep):
            raise ValueError("sweep_num_prompts needs one count per concurrency sweep level")
        if any(n < 1 for n in self.sweep_num_prompts):
            raise ValueError("sweep_num_prompts must be >= 1")
        if self.ramp_up_s < 0:
            raise ValueError("ramp_up_s must be >= 0")
        if self.transport not in ("raw", "httpx"):
            raise ValueError(f"transport must be raw or httpx, got {self.transport!r}")
        if self.connections not in ("keep-alive", "close"):
            raise ValueError(f"connections must be keep-alive or close, got {self.connections!r}")


# ----------------------------------------------------------------------------- one request


def _request_body(cfg: BenchConfig, model: str, prompt_ids: list[int], output_len: int) -> dict:
    return {"model": model, "prompt": prompt_ids, "max_tokens": output_len, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
            **({"return_token_ids": True} if cfg.request_token_ids else {}), **cfg.extra_body}


class _HTTPStatus(Exception):
    """A response other than 200 from the raw client: the status and the body's text."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:300]}")


POOL_MAX = 1024  # most connections a keep-alive pool opens before the clock


def _pool_max() -> int:
    """POOL_MAX, or half the soft open-files limit when that is lower (1024 by default on Linux)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return POOL_MAX
    return POOL_MAX if soft == resource.RLIM_INFINITY else max(1, min(POOL_MAX, soft // 2))


class ConnectionPool:
    """Idle HTTP/1.1 keep-alive connections to one server, for the raw transport.

    `acquire` hands out an idle connection (or opens one), `release` takes back a connection whose
    response was read to its end, `warm(n)` opens n connections ahead. One event loop only."""

    def __init__(self, base_url: str) -> None:
        url = urlsplit(base_url)
        self.host, self.port = url.hostname, url.port or 80
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened = 0  # connections opened in all (warm-up included)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new connection (counted in `opened`), not put in the pool."""
        self.opened += 1
        return await asyncio.open_connection(self.host, self.port, limit=1 << 22)

    async def acquire(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        """(reader, writer, reused): an idle connection the server has not closed, else a new one."""
        while self.idle:
            reader, writer = self.idle.pop()
            # bytes that arrived while it was idle (an unsolicited 408 before the server closes it, a
            # stray CRLF) belong to no request of ours: the next request would read them as its answer
            if not writer.is_closing() and not reader.at_eof() and not getattr(reader, "_buffer", b""):
                return reader, writer, True
            writer.close()
        return (*await self.connect(), False)

    def release(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.idle.append((reader, writer))

    async def warm(self, n: int) -> None:
        """Open connections until n are idle (at most POOL_MAX, and half the soft open-files limit).
        Raises OSError when one cannot be opened (those opened by this call are closed first)."""
        need = min(n, _pool_max()) - len(self.idle)
        if need <= 0:
            return
        opened = await asyncio.gather(*(self.connect() for _ in range(need)), return_exceptions=True)
        conns = [c for c in opened if not isinstance(c, BaseException)]
        errors = [c for c in opened if isinstance(c, BaseException)]
        if errors:
            for _, writer in conns:
                writer.close()
            raise errors[0]
        self.idle.extend(conns)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def _raw_sse(cfg: BenchConfig, body: bytes, path: str = "/v1/completions",
                   pool: ConnectionPool | None = None) -> AsyncIterator[bytes]:
    """POST `body` (JSON) to cfg.base_url + path and yield the response body's lines (bytes, line ends
    removed) as they arrive.

    Without `pool`: over a fresh HTTP/1.1 connection, closed after. With `pool`: over one of its
    connections (keep-alive); the connection goes back to the pool when its response was read to the
    end (a reader that stops early, e.g. at `data: [DONE]`, has the rest read when it closes this
    generator: at most 1 s, inside the caller's concurrency slot) and the server did not ask to close
    it. A reused connection that the server closed before answering, or answered with 408 (it timed
    the idle connection out), is replaced by a fresh one, once; the request is then sent again (its
    TTFT includes the failed attempt).

    Reads chunked, content-length and close-delimited bodies. Raises _HTTPStatus on a status other
    than 200 (after reading the body), OSError / EOFError (asyncio.IncompleteReadError) when the
    connection fails or ends early, ValueError on a malformed response."""
    url = urlsplit(cfg.base_url)
    auth = f"authorization: Bearer {cfg.api_key}\r\n" if cfg.api_key else ""
    close = "" if pool else "connection: close\r\n"
    request = (f"POST {url.path.rstrip('/')}{path} HTTP/1.1\r\nhost: {url.netloc}\r\n"
               f"content-type: application/json\r\naccept: text/event-stream\r\n{auth}"
               f"content-length: {len(body)}\r\n{close}\r\n").encode() + body
    if pool is None:
        reader, writer = await asyncio.open_connection(url.hostname, url.port or 80, limit=1 << 22)
        reused = False
    else:
        reader, writer, reused = await pool.acquire()
    done = keep = False  # done: the response was read to its end and the connection may serve another
    body_pieces: AsyncIterator[bytes] | None = None
    try:
        try:
            writer.write(request)
            raw_head = await reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError):
            if not reused:
                raise
            raw_head = b""
        if reused and (not raw_head or raw_head.split(b" ", 2)[1:2] == [b"408"]):
            # the server closed the idle connection, or timed it out (408) as we sent: once more, fresh
            assert pool is not None
            writer.close()
            reader, writer = await pool.connect()
            writer.write(request)
            raw_head = await reader.readuntil(b"\r\n\r\n")
        head = raw_head.decode("latin-1").split("\r\n")
        parts = head[0].split()
        if len(parts) < 2 or not parts[1].isdigit():
            raise ValueError(f"bad HTTP status line {head[0][:80]!r}")
        status = int(parts[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
        chunked = "chunked" in fields.get("transfer-encoding", "").lower()
        length = None if chunked or "content-length" not in fields else int(fields["content-length"])
        keep = pool is not None and (chunked or length is not None) \
            and "close" not in fields.get("connection", "").lower()

        async def pieces() -> AsyncIterator[bytes]:
            nonlocal done
            if chunked:
                while size := int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16):
                    yield (await reader.readexactly(size + 2))[:-2]
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, then the blank line
                    pass
            elif length is not None:
                if length:
                    yield await reader.readexactly(length)
            else:
                while data := await reader.read(1 << 16):
                    yield data
            done = keep

        body_pieces = pieces()
        if status != 200:
            raise _HTTPStatus(status, b"".join([p async for p in body_pieces]).decode(errors="replace"))
        buf = b""
        async for piece in body_pieces:
            *lines, buf = (buf + piece).split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r")
        if buf:
            yield buf.rstrip(b"\r")
    finally:
        if keep and not done and body_pieces is not None:
            try:  # the reader stopped before the end (at [DONE]): read the rest, keep the connection
                await asyncio.wait_for(_drain(body_pieces), 1.0)
            except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                pass
        if pool is not None and done:
            pool.release(reader, writer)
        else:
            writer.close()


async def _drain(pieces: AsyncIterator[bytes]) -> None:
    async for _ in pieces:
        pass


async def _httpx_sse(client: httpx.AsyncClient, body: bytes) -> AsyncIterator[bytes]:
    """The same as _raw_sse over the httpx client (its connection pool); raises _HTTPStatus."""
    async with client.stream("POST", "/v1/completions", content=body, headers=_JSON_HEADERS) as resp:
        if resp.status_code != 200:
            raise _HTTPStatus(resp.status_code, (await resp.aread()).decode(errors="replace"))
        async for line in resp.aiter_lines():
            yield line.encode()


async def send_request(client: httpx.AsyncClient, cfg: BenchConfig, model: str, out: RequestOutcome,
                       prompt_ids: list[int], pool: ConnectionPool | None = None) -> RequestOutcome:
    """Stream one completion into `out` (errors are recorded in out.error, never raised). The body
    is encoded with orjson (~10x stdlib json on a 2K-token prompt); cfg.transport picks the client
    (`client` is used only by the httpx transport and for https URLs); the raw transport takes its
    connection from `pool` when given (keep-alive), else opens one for this request."""
    body = _dumps(_request_body(cfg, model, prompt_ids, out.output_len))
    last = [0.0]
    out.start_s = time.perf_counter()
    raw = cfg.transport == "raw" and cfg.base_url.startswith("http://")
    lines = _raw_sse(cfg, body, pool=pool) if raw else _httpx_sse(client, body)

    async def consume() -> None:
        async for line in lines:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            _apply_event(out, _loads(data), time.perf_counter(), last)

    try:
        await asyncio.wait_for(consume(), cfg.timeout_s)
        out.e2e_s = time.perf_counter() - out.start_s
    except _HTTPStatus as e:
        out.error = str(e)
    except asyncio.TimeoutError:
        out.error = f"TimeoutError: no complete response within {cfg.timeout_s} s"
    except (httpx.HTTPError, ValueError, OSError, EOFError) as e:  # JSON decode errors are ValueErrors
        out.error = f"{type(e).__name__}: {e}"
    finally:
        await lines.aclose()
    return out


# ----------------------------------------------------------------------------- load generation


@dataclass(slots=True)
class _RunState:
    client: httpx.AsyncClient
    cfg: BenchConfig
    model: str
    semaphore: asyncio.Semaphore | None
    pbar: tqdm
    pool: ConnectionPool | None = None  # the raw transport's keep-alive connections (cfg.connections)
    outcomes: list[RequestOutcome] = field(default_factory=list)
    synthetic_answers: int = 0
    t_start_s: float = 0.0  # perf_counter when the measured sessions started (the duration's clock)


async def _run_session(state: _RunState, session: Session, seed: int) -> None:
    """Turns in order; turn k resends prompt k-1 + answer k-1 + new user tokens. Stops at an error."""
    prompt: list[int] | None = None
    answer: list[int] | None = None
    for k, turn in enumerate(session.turns):
        prompt = next_prompt(prompt, answer, turn)
        out = RequestOutcome(session.session_id, k, len(prompt), turn.output_len)
        if state.semaphore is None:
            await send_request(state.client, state.cfg, state.model, out, prompt, state.pool)
        else:
            async with state.semaphore:
                await send_request(state.client, state.cfg, state.model, out, prompt, state.pool)
        state.outcomes.append(out)
        state.pbar.update(1)
        if not out.ok:
            state.pbar.update(len(session.turns) - k - 1)
            return
        answer = out.answer_ids
        if answer is None or len(answer) != out.output_tokens:
            # No token ids from the server: stand-in ids of the right length (cache hits on them are lost).
            rng = np.random.default_rng([seed, session.session_id, k])
            answer = rng.integers(state.cfg.workload.min_token_id, state.cfg.workload.vocab_size,
                                  size=out.output_tokens).tolist()
            state.synthetic_answers += 1


def _arrival_offsets_s(n: int, rate: float, seed: int, ramp: tuple[int, float] = (0, 0.0)) -> list[float]:
    """Start offsets (s) of n sessions: a Poisson process of `rate` per second, or all 0 for inf
    (ramp (c, s): the first c evenly over s seconds, the rest at 0: they wait for a free slot)."""
    if np.isinf(rate):
        c, ramp_s = ramp
        return [i * ramp_s / c if i < c else 0.0 for i in range(n)] if c and ramp_s > 0 else [0.0] * n
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    return np.concatenate([[0.0], np.cumsum(gaps)[:-1]]).tolist()


async def _run_sessions(state: _RunState, sessions: list[Session], rate: float, seed: int,
                        ramp: tuple[int, float] = (0, 0.0)) -> float:
    """Start every session on its arrival time; returns the duration (s) until the last one ended."""
    t0 = state.t_start_s = time.perf_counter()
    tasks = []
    offsets = _arrival_offsets_s(len(sessions), rate, seed, ramp)
    if ramp[1] > 0 and np.isinf(rate):  # sessions after the first c queue behind them in order
        offsets = [o if i < ramp[0] else ramp[1] for i, o in enumerate(offsets)]
    for session, offset in zip(sessions, offsets, strict=True):
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_run_session(state, session, seed)))
    await asyncio.gather(*tasks)
    return time.perf_counter() - t0


def _make_client(cfg: BenchConfig) -> httpx.AsyncClient:
    # No pool limit: a request waiting for a connection would count that wait in its TTFT.
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=cfg.base_url, timeout=httpx.Timeout(cfg.timeout_s), limits=limits,
                             headers=headers, trust_env=False)


async def _resolve_model(client: httpx.AsyncClient, cfg: BenchConfig) -> str:
    if cfg.model:
        return cfg.model
    resp = await client.get("/v1/models")
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


async def _warmup(state: _RunState) -> None:
    """Short requests on prompts from another seed, so the measured run starts warm."""
    spec = state.cfg.workload
    rng = np.random.default_rng([spec.seed, 0x5EED])
    for i in range(state.cfg.warmup_requests):
        ids = rng.integers(spec.min_token_id, spec.vocab_size, size=16).tolist()
        out = await send_request(state.client, state.cfg, state.model, RequestOutcome(-1, i, 16, 4), ids,
                                 state.pool)
        if not out.ok:
            raise RuntimeError(f"warm-up request failed: {out.error}")


async def _flush_cache(client: httpx.AsyncClient) -> int:
    try:
        return (await client.post("/flush_cache")).status_code
    except httpx.HTTPError:
        return -1


def _warm_count(num_sessions: int, max_concurrency: int | None, request_rate: float) -> int:
    """Connections to open before the clock: --max-concurrency, else every session when they all
    start at once (infinite rate), else none (arrivals spread over time open connections as they
    need them, and later requests reuse them)."""
    if max_concurrency:
        return min(max_concurrency, num_sessions)
    return num_sessions if np.isinf(request_rate) else 0


async def run_once(cfg: BenchConfig, workload: Workload, max_concurrency: int | None,
                   ) -> tuple[dict, list[RequestOutcome], str]:
    """One measured pass over the workload: (run metrics dict, per-request outcomes, model name)."""
    async with _make_client(cfg) as client:
        model = await _resolve_model(client, cfg)
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        with tqdm(total=workload.num_requests, disable=cfg.disable_tqdm, unit="req",
                  desc=f"{workload.spec.name} c={max_concurrency or 'inf'}") as pbar:
            raw = cfg.transport == "raw" and cfg.base_url.startswith("http://")
            pool = ConnectionPool(cfg.base_url) if raw and cfg.connections == "keep-alive" else None
            state = _RunState(client, cfg, model, sem, pbar, pool)
            try:
                if cfg.flush_cache:
                    await _flush_cache(client)
                await _warmup(state)
                if pool is not None:  # one connection per request that can be in flight at once
                    await pool.warm(_warm_count(len(workload.sessions), max_concurrency, cfg.request_rate))
                ramp = (max_concurrency or 0, cfg.ramp_up_s)
                duration_s = await _run_sessions(state, workload.sessions, cfg.request_rate,
                                                 workload.spec.seed, ramp)
            finally:
                if pool is not None:
                    pool.close()
    metrics = summarize(state.outcomes, duration_s)
    metrics["max_concurrency"] = max_concurrency
    metrics["connections"] = cfg.connections if pool is not None else "close"
    metrics["connections_opened"] = pool.opened if pool is not None else None
    metrics["start_perf_s"] = state.t_start_s  # time.perf_counter() at the duration's start
    metrics["ramp_up_s"] = cfg.ramp_up_s
    metrics["request_rate"] = cfg.request_rate if np.isfinite(cfg.request_rate) else "inf"
    if workload.is_multi_turn:
        metrics["answer_ids_source"] = "synthetic" if state.synthetic_answers else "server"
    return metrics, state.outcomes, model


# ----------------------------------------------------------------------------- entry points


def _write_plots(cfg: BenchConfig, runs: list[dict], samples: dict[str, list[RequestOutcome]]) -> list[str]:
    try:
        from . import plots
    except ImportError:
        from bench import plots
    plot_dir = Path(cfg.plot_dir or ".")
    paths = [plots.plot_latency_cdfs(samples, plot_dir / f"latency_cdf_{cfg.workload.name}.png")]
    if cfg.concurrency_sweep:
        paths.append(plots.plot_concurrency_sweep(runs, plot_dir / f"concurrency_{cfg.workload.name}.png"))
    return [str(p) for p in paths]


def _fit_vocab(cfg: BenchConfig) -> BenchConfig:
    """Token ids are drawn below --vocab-size; a radixrt server reports its vocabulary in
    /get_server_info, and a smaller one caps the draw (other servers: the flag stands)."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    try:
        r = httpx.get(cfg.base_url.rstrip("/") + "/get_server_info", headers=headers, timeout=10,
                      trust_env=False)
        vocab = int(r.json()["worker"]["vocab_size"]) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        vocab = None
    if vocab is None or vocab >= cfg.workload.vocab_size:
        return cfg
    print(f"bench-serving: the server's vocabulary has {vocab} tokens: drawing token ids below it",
          file=sys.stderr)
    low = min(cfg.workload.min_token_id, vocab // 2)
    return replace(cfg, workload=replace(cfg.workload, vocab_size=vocab, min_token_id=low))


def run_benchmark(cfg: BenchConfig) -> dict:
    """Run the workload (once, or once per sweep level); write JSON / plots if asked; return the report.

    Report: schema_version, tool, created_at, base_url, model, workload (spec + counts), config,
    runs (one dict of RUN_FIELDS per run), plots (PNG paths). Raises RuntimeError if warm-up fails.
    """
    cfg = _fit_vocab(cfg)
    levels = cfg.concurrency_sweep or [cfg.max_concurrency]
    runs, samples, model = [], {}, cfg.model
    for i, level in enumerate(levels):
        # Each sweep level gets fresh prompts (seed + i): a prefix cache must not serve one level's
        # prompts from the previous level's run.
        num_prompts = cfg.sweep_num_prompts[i] if cfg.sweep_num_prompts else cfg.workload.num_prompts
        workload = replace(cfg.workload, seed=cfg.workload.seed + i, num_prompts=num_prompts).build()
        metrics, outcomes, model = asyncio.run(run_once(cfg, workload, level))
        metrics["workload_seed"] = workload.spec.seed
        runs.append(metrics)
        samples[f"c={level or 'inf'}"] = outcomes
    report = {
        "schema_version": SCHEMA_VERSION, "tool": "radixrt bench-serving",
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "base_url": cfg.base_url, "model": model,
        "workload": cfg.workload.build().describe(),
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("workload", "api_key")},
        "runs": runs, "plots": [],
    }
    report["config"]["request_rate"] = runs[0]["request_rate"]
    if cfg.plot_dir:
        report["plots"] = _write_plots(cfg, runs, samples)
    if cfg.output_json:
        Path(cfg.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.output_json).write_text(json.dumps(report, indent=2))
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixrt bench-serving", description=__doc__.split("\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--model", default=None, help="model name in requests (default: first of /v1/models)")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="sessions/s, Poisson (default inf)")
    p.add_argument("--max-concurrency", type=int, default=None, help="max requests in flight")
    p.add_argument("--concurrency-sweep", default="", help='e.g. "1,4,16,64": one run per level')
    p.add_argument("--sweep-num-prompts", default="",
                   help='e.g. "8,64,128,512": --num-prompts of each sweep level (random, long-short)')
    p.add_argument("--ramp-up-s", type=float, default=0.0,
                   help="with --max-concurrency c and an infinite rate: start the first c sessions "
                        "evenly over this many seconds (about one request's e2e: steady-state TTFT)")
    p.add_argument("--warmup-requests", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    p.add_argument("--api-key", default=None)
    p.add_argument("--flush-cache", action="store_true", help="POST /flush_cache before each run")
    p.add_argument("--output-json", default=None)
    p.add_argument("--plot-dir", default=None, help="write PNG latency CDFs (and the sweep plot) here")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--extra-body", default="{}", help="JSON object merged into every request body")
    p.add_argument("--transport", choices=["raw", "httpx"], default="raw",
                   help="the streaming client: a minimal asyncio HTTP/1.1 one (raw) or httpx")
    p.add_argument("--connections", choices=["keep-alive", "close"], default="keep-alive",
                   help="raw transport: reuse connections opened before the clock (keep-alive), or a "
                        "fresh connection per request (close)")
    p.add_argument("--no-request-token-ids", action="store_true",
                   help="do not send return_token_ids (for servers that reject unknown fields)")
    add_workload_args(p)
    return p


def config_from_args(ns: argparse.Namespace) -> BenchConfig:
    """BenchConfig from parsed flags; raises ValueError on bad values."""
    sweep = [int(x) for x in ns.concurrency_sweep.split(",") if x.strip()]
    sweep_prompts = [int(x) for x in ns.sweep_num_prompts.split(",") if x.strip()]
    return BenchConfig(base_url=ns.base_url, model=ns.model, workload=spec_from_args(ns),
                       request_rate=ns.request_rate, max_concurrency=ns.max_concurrency,
                       concurrency_sweep=sweep, sweep_num_prompts=sweep_prompts,
                       warmup_requests=ns.warmup_requests, timeout_s=ns.timeout_s,
                       api_key=ns.api_key, flush_cache=ns.flush_cache, output_json=ns.output_json,
                       plot_dir=ns.plot_dir, disable_tqdm=ns.disable_tqdm,
                       extra_body=json.loads(ns.extra_body),
                       request_token_ids=not ns.no_request_token_ids, ramp_up_s=ns.ramp_up_s,
                       transport=ns.transport, connections=ns.connections)


def main(argv: list[str] | None = None) -> int:
    """CLI entry (also `radixrt bench-serving`). Exit 0 if every request succeeded, 1 otherwise, 2 on bad
    flags."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        cfg = config_from_args(ns)
    except ValueError as e:
        parser.error(str(e))
    try:
        report = run_benchmark(cfg)
    except (RuntimeError, httpx.HTTPError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(format_report(report))
    return 0 if all(r["failed"] == 0 for r in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
