"""Soak and fault harness: sustained mixed load with clients that vanish, then a check that nothing
leaked. `python -m bench.soak --launch --requests 2000 --concurrency 64` (or `--base-url URL`).

The run: `--requests` clients (bench/soak_requests.py: chat / completions / generate, streamed and
not, long prompts, n > 1, logprobs, stop strings, json_schema outputs; `--disconnect-frac` of them
leave during prefill, mid-stream or by cancelling a non-streamed request; `--malformed-frac` send
bad requests), at most `--concurrency` at once, while /health is polled every second.

The checks afterwards (each a line of `problems`; exit 1 if any):
- every complete client got 200 with finish_reason stop/length on every choice and full usage; no
  stream ended without `[DONE]` or with an error event; every malformed one got a 4xx with an
  OpenAI error body; no 5xx; no client hung past `--request-timeout-s`; /health stayed 200;
- once idle: running and waiting requests 0 (/get_server_info and /metrics), the front end tracks
  no sample, the KV invariant holds (`invariants_ok`, checked by the scheduler when idle; start the
  server with RADIXRT_DEBUG_INVARIANTS=1 to have it checked on every idle tick too);
- radixrt_requests_total: every outcome label's growth is reported; ok grew by at least the complete
  clients and ok + aborted + disconnected by at most complete + abandoned (an abandoned request whose
  samples had all finished generating counts as ok, one that left before the server read it as
  disconnected; one abandoned before it reached the server's app has no outcome and is reported as
  `abandoned_never_seen`); aborted + disconnected by at most the abandoned ones; no request ended as
  "error"; and no request handle is left without an outcome, live or garbage-collected
  (radixrt_tokenizer_unfinished_handles, radixrt_tokenizer_collected_unfinished_handles);
- resident memory of the server's processes (launcher + children, when their pid is known) is
  back within RSS_MARGIN of the baseline taken after a warm-up; on a CPU server the KV pool's pages
  are committed as they are first written (calloc, radixrt/worker/kv_pool.py), so the pool's size
  is allowed on top: growth beyond margin + pool is reported as a leak.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from bench.soak_requests import (
    Outcome,
    Plan,
    check_choices,
    check_error_body,
    check_usage,
    make_plans,
)

RSS_MARGIN_FRAC = 0.15  # resident memory after the run may exceed the baseline by this fraction ...
RSS_MARGIN_BYTES = 128 * 1024 * 1024  # ... or by this much, whichever is larger (allocator slack)
IDLE_TIMEOUT_S = 120.0


@dataclass
class SoakConfig:
    """Load shape of one run."""

    num_requests: int = 200
    concurrency: int = 16
    disconnect_frac: float = 0.1
    malformed_frac: float = 0.05
    max_tokens: int = 8
    long_words: int = 400  # words of a long prompt (~1 token each)
    seed: int = 0
    request_timeout_s: float = 300.0  # a client still waiting after this counts as hung
    warmup: int = 16  # requests run before the RSS baseline


@dataclass
class SoakReport:
    """Everything a run measured; `problems` empty means it passed."""

    config: dict[str, Any]
    duration_s: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    by_kind: dict[str, int] = field(default_factory=dict)
    aborted_counter_delta: float = 0.0
    ok_counter_delta: float = 0.0
    outcome_deltas: dict[str, float] = field(default_factory=dict)  # every outcome label's growth
    health_failures: int = 0
    idle_stats: dict[str, Any] = field(default_factory=dict)
    rss_baseline_bytes: int = 0
    lazy_pool_bytes: int = 0  # a CPU server's KV pool, committed page by page as it is first written
    rss_after_bytes: int = 0
    problems: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- one client
async def _post(client: httpx.AsyncClient, plan: Plan, out: Outcome) -> None:
    content = plan.raw if plan.raw is not None else orjson.dumps(plan.body)
    headers = {"content-type": "application/json"}
    if not plan.stream:
        if plan.action == "abort":
            try:
                await asyncio.wait_for(client.post(plan.path, content=content, headers=headers), plan.after_s)
                out.problem = "abandoned request finished before the client left"
            except TimeoutError:
                pass
            return
        r = await client.post(plan.path, content=content, headers=headers)
        out.status = r.status_code
        _judge_json(plan, r, out)
        return
    async with client.stream("POST", plan.path, content=content, headers=headers) as r:
        out.status = r.status_code
        if r.status_code != 200:
            out.problem = check_error_body(r.status_code, await r.aread()) or f"stream got {r.status_code}"
            return
        if plan.action == "disconnect" and plan.after_chunks == 0:
            return  # headers arrived with the first output: leave now
        lines: list[bytes] = []
        async for line in r.aiter_lines():
            if line:
                lines.append(line.encode())
                if plan.action == "disconnect" and len(lines) >= plan.after_chunks:
                    if line == "data: [DONE]":
                        out.problem = "abandoned stream finished before the client left"
                    return
        _judge_stream(plan, lines, out)


async def _disconnect_during_prefill(client: httpx.AsyncClient, plan: Plan, out: Outcome) -> None:
    """Send the request and leave after `after_s`, most likely before its first output."""
    try:
        await asyncio.wait_for(_post(client, plan, out), plan.after_s)
    except TimeoutError:
        pass


def _judge_json(plan: Plan, r: httpx.Response, out: Outcome) -> None:
    if plan.action == "malformed":
        if not 400 <= r.status_code < 500:
            out.problem = f"malformed request got {r.status_code}"
        else:
            out.problem = check_error_body(r.status_code, r.content)
        return
    if r.status_code != 200:
        out.problem = f"status {r.status_code}: {r.text[:200]}"
        return
    data = r.json()
    out.problem = check_choices(plan, data["choices"]) or check_usage(data.get("usage"))
    if data.get("usage"):
        out.prompt_tokens, out.completion_tokens = data["usage"]["prompt_tokens"], data["usage"][
            "completion_tokens"]


def _judge_stream(plan: Plan, lines: list[bytes], out: Outcome) -> None:
    if not lines or lines[-1] != b"data: [DONE]":
        out.problem = f"stream did not end with [DONE]: {lines[-2:]!r}"
        return
    events = [orjson.loads(ln.removeprefix(b"data: ")) for ln in lines[:-1] if ln.startswith(b"data: ")]
    if any("error" in ev for ev in events):
        out.problem = f"stream error event: {next(ev for ev in events if 'error' in ev)}"
        return
    if plan.path == "/generate":
        last = events[-1]
        meta = last["meta_info"]
        ch = {"finish_reason": meta["finish_reason"], "text": last["text"]}
        usage = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                 "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
                 "prompt_tokens_details": {"cached_tokens": meta["cached_tokens"]}}
        out.problem = check_choices(plan, [ch]) or check_usage(usage)
        return
    texts: dict[int, list[str]] = {}
    finish: dict[int, Any] = {}
    usage = None
    for ev in events:
        if ev.get("usage"):
            usage = ev["usage"]
        for c in ev.get("choices", []):
            piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
            texts.setdefault(c["index"], []).append(piece or "")
            if c.get("finish_reason") is not None:
                finish[c["index"]] = c["finish_reason"]
    choices = [{"finish_reason": finish.get(i), "text": "".join(t)} for i, t in sorted(texts.items())]
    out.problem = check_choices(plan, choices) or check_usage(usage)
    if usage:
        out.prompt_tokens, out.completion_tokens = usage["prompt_tokens"], usage["completion_tokens"]


async def run_client(client: httpx.AsyncClient, plan: Plan, timeout_s: float) -> Outcome:
    """Run one plan; a client still waiting after timeout_s is `hung`."""
    out = Outcome(plan.kind, plan.action)
    t0 = time.perf_counter()
    work = _disconnect_during_prefill(client, plan, out) if (
        plan.action == "disconnect" and plan.after_chunks == 0) else _post(client, plan, out)
    try:
        await asyncio.wait_for(work, timeout_s)
    except TimeoutError:
        out.hung, out.problem = True, f"no answer within {timeout_s:g} s"
    except httpx.HTTPError as e:
        out.problem = f"{type(e).__name__}: {e}"
    out.latency_s = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------------- the server's side
def server_rss_bytes(pid: int | None) -> int:
    """Resident memory of process pid and all its descendants (0 when pid is None or gone)."""
    if pid is None:
        return 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one sample of Prometheus text (0.0 when absent)."""
    pat = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else r"(?:\{\})?") + r" (\S+)"
    m = re.search(r"^" + pat + r"$", text, re.M)
    return float(m.group(1)) if m else 0.0


_UNFINISHED_RE = re.compile(r'^radixrt_tokenizer_unfinished_handles\{kind="([^"]*)"\} (\S+)$', re.M)
_COLLECTED_RE = re.compile(r'^radixrt_tokenizer_collected_unfinished_handles\{kind="([^"]*)"\} (\S+)$', re.M)
_OUTCOME_RE = re.compile(r'^radixrt_requests_total\{outcome="([^"]*)"\} (\S+)$', re.M)


async def outcome_counts(client: httpx.AsyncClient) -> dict[str, float]:
    """radixrt_requests_total by outcome label (ok, aborted, rejected, error, ...), from /metrics."""
    text = (await client.get("/metrics")).text
    return {m.group(1): float(m.group(2)) for m in _OUTCOME_RE.finditer(text)}


async def lazy_pool_bytes(client: httpx.AsyncClient) -> int:
    """The KV pool's size in bytes when the server runs on the CPU (its pages are committed as they
    are first written), else 0 (a GPU pool is device memory, not resident host memory)."""
    worker = (await client.get("/get_server_info")).json().get("worker", {})
    return int(float(worker.get("pool_gib", 0)) * 2**30) if worker.get("device") == "cpu" else 0


async def wait_idle(client: httpx.AsyncClient, timeout_s: float = IDLE_TIMEOUT_S) -> dict[str, Any]:
    """Poll until the scheduler runs and queues nothing and the front end tracks no sample; returns
    the last scheduler stats with `invariants_ok` and the front end's in-flight gauge."""
    deadline = time.monotonic() + timeout_s
    stats: dict[str, Any] = {}
    while time.monotonic() < deadline:
        info = (await client.get("/get_server_info")).json()
        stats = dict(info.get("scheduler", {}))
        text = (await client.get("/metrics")).text
        stats["tokenizer_inflight_samples"] = metric(text, "radixrt_tokenizer_inflight_samples")
        stats["metrics_num_running_reqs"] = metric(text, "radixrt_num_running_reqs")
        stats["metrics_num_waiting_reqs"] = metric(text, "radixrt_num_waiting_reqs")
        # requests without an outcome yet (live) or ever (garbage-collected), by kind
        stats["unfinished_handles"] = {m.group(1): float(m.group(2)) for m in _UNFINISHED_RE.finditer(text)}
        stats["collected_unfinished_handles"] = {m.group(1): float(m.group(2))
                                                 for m in _COLLECTED_RE.finditer(text)}
        if (stats.get("num_running_reqs") == 0 and stats.get("num_waiting_reqs") == 0
                and stats["tokenizer_inflight_samples"] == 0 and stats.get("invariants_ok") is not None):
            return stats
        await asyncio.sleep(0.5)
    stats["timed_out"] = True
    return stats


async def _poll_health(client: httpx.AsyncClient, stop: asyncio.Event, report: SoakReport) -> None:
    while not stop.is_set():
        try:
            if (await client.get("/health", timeout=30.0)).status_code != 200:
                report.health_failures += 1
        except httpx.HTTPError:
            report.health_failures += 1
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            pass


# ----------------------------------------------------------------------------- the run
async def _run_all(client: httpx.AsyncClient, plans: list[Plan], cfg: SoakConfig) -> list[Outcome]:
    sem = asyncio.Semaphore(cfg.concurrency)

    async def one(plan: Plan) -> Outcome:
        async with sem:
            return await run_client(client, plan, cfg.request_timeout_s)

    return list(await asyncio.gather(*(one(p) for p in plans)))


def _tally(report: SoakReport, outcomes: list[Outcome]) -> None:
    c = report.counts
    for o in outcomes:
        c["requests"] = c.get("requests", 0) + 1
        c[o.action] = c.get(o.action, 0) + 1
        report.by_kind[o.kind] = report.by_kind.get(o.kind, 0) + 1
        if o.status is not None and o.status >= 500:
            c["http_5xx"] = c.get("http_5xx", 0) + 1
        if o.hung:
            c["hung"] = c.get("hung", 0) + 1
        if o.problem is not None:
            c["failed"] = c.get("failed", 0) + 1
            if len(report.problems) < 20:
                report.problems.append(f"{o.kind} ({o.action}): {o.problem}")
        if o.action == "complete" and o.problem is None:
            c["completed_ok"] = c.get("completed_ok", 0) + 1
            c["prompt_tokens"] = c.get("prompt_tokens", 0) + o.prompt_tokens
            c["completion_tokens"] = c.get("completion_tokens", 0) + o.completion_tokens
    for key in ("http_5xx", "hung", "failed"):
        c.setdefault(key, 0)
    c["abandoned"] = c.get("disconnect", 0) + c.get("abort", 0)


def _check_idle(report: SoakReport, pid: int | None) -> None:
    s, p = report.idle_stats, report.problems
    if s.get("timed_out"):
        p.append(f"server not idle {IDLE_TIMEOUT_S:g} s after the run: {s}")
    if s.get("invariants_ok") is not True:
        p.append(f"KV invariant: {s.get('invariants_ok')} {s.get('invariant_error', '')}")
    if s.get("metrics_num_running_reqs") or s.get("metrics_num_waiting_reqs"):
        p.append("/metrics shows running or waiting requests after the run")
    # A client that leaves after its request finished on the server (a fast server, a late disconnect)
    # leaves an "ok" request, not an aborted one: each abandoned request is one of the two, and every
    # request that was not malformed is recorded exactly once.
    # A client that leaves before the server read its request leaves a "disconnected" one.
    abandoned, complete = report.counts["abandoned"], report.counts.get("complete", 0)
    left = report.aborted_counter_delta + report.outcome_deltas.get("disconnected", 0)
    if left > abandoned:
        p.append(f"aborted + disconnected counters grew by {left:g}, "
                 f"only {abandoned} clients abandoned their requests")
    # Every complete request is recorded; an abandoned one is recorded unless it never reached the
    # server's app (no handle: the live and collected unfinished-handle gauges, checked below, show
    # that every handle recorded its outcome). The difference is reported as never seen.
    recorded = left + report.ok_counter_delta
    if report.ok_counter_delta < complete or not complete <= recorded <= complete + abandoned:
        p.append(f"the server recorded {report.ok_counter_delta:g} ok + {left:g} aborted or "
                 f"disconnected requests, {complete} complete + {abandoned} abandoned were sent "
                 f"(all outcomes: {_fmt_outcomes(report.outcome_deltas)})")
    report.counts["abandoned_never_seen"] = int(complete + abandoned - recorded)
    for key in ("unfinished_handles", "collected_unfinished_handles"):
        if any(s.get(key, {}).values()):
            p.append(f"{key.replace('_', ' ')} after the run: {s[key]}")
    if report.outcome_deltas.get("error"):
        p.append(f"{report.outcome_deltas['error']:g} requests ended with outcome \"error\" (a 5xx)")
    if report.health_failures:
        p.append(f"/health failed {report.health_failures} times during the run")
    limit = (report.rss_baseline_bytes + report.lazy_pool_bytes
             + max(RSS_MARGIN_BYTES, RSS_MARGIN_FRAC * report.rss_baseline_bytes))
    if pid is not None and report.rss_after_bytes > limit:
        p.append(f"resident memory {report.rss_after_bytes / 2**20:.0f} MiB after the run, baseline "
                 f"{report.rss_baseline_bytes / 2**20:.0f} MiB (limit {limit / 2**20:.0f} MiB)")


async def soak(base_url: str, cfg: SoakConfig, pid: int | None = None,
               api_key: str | None = None) -> SoakReport:
    """One soak run against base_url; pid (the launcher's) enables the memory check."""
    report = SoakReport(config=asdict(cfg))
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=cfg.concurrency + 8, max_keepalive_connections=cfg.concurrency)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(cfg.request_timeout_s, connect=30.0)) as client:
        warm = make_plans(cfg.warmup, cfg.seed + 1, 0.0, 0.0, cfg.max_tokens, cfg.long_words)
        await _run_all(client, warm, cfg)
        await wait_idle(client)
        print(f"soak: warm-up done, running {cfg.num_requests} requests", flush=True)
        report.rss_baseline_bytes = server_rss_bytes(pid)
        report.lazy_pool_bytes = await lazy_pool_bytes(client)
        counts0 = await outcome_counts(client)
        plans = make_plans(cfg.num_requests, cfg.seed, cfg.disconnect_frac, cfg.malformed_frac,
                           cfg.max_tokens, cfg.long_words)
        stop = asyncio.Event()
        health = asyncio.ensure_future(_poll_health(client, stop, report))
        t0 = time.perf_counter()
        outcomes = await _run_all(client, plans, cfg)
        report.duration_s = time.perf_counter() - t0
        stop.set()
        await health
        report.idle_stats = await wait_idle(client)
        counts1 = await outcome_counts(client)
        report.outcome_deltas = {k: counts1.get(k, 0.0) - counts0.get(k, 0.0)
                                 for k in sorted(set(counts0) | set(counts1))}
        report.aborted_counter_delta = report.outcome_deltas.get("aborted", 0.0)
        report.ok_counter_delta = report.outcome_deltas.get("ok", 0.0)
        report.rss_after_bytes = server_rss_bytes(pid)
    _tally(report, outcomes)
    _check_idle(report, pid)
    return report


def _fmt_outcomes(deltas: dict[str, float]) -> str:
    return ", ".join(f"{k} +{v:g}" for k, v in deltas.items() if v) or "none"


def format_report(r: SoakReport) -> str:
    """The load held and every count, one block of text."""
    c, cfg = r.counts, r.config
    rate = c["requests"] / max(r.duration_s, 1e-9)
    idle = r.idle_stats
    lines = [f"soak: {c['requests']} requests at concurrency {cfg['concurrency']} in {r.duration_s:.1f} s "
             f"({rate:.2f} req/s), disconnect share {cfg['disconnect_frac']}, "
             f"malformed share {cfg['malformed_frac']}",
             "counts: " + ", ".join(f"{k}={v}" for k, v in sorted(c.items())),
             "by kind: " + ", ".join(f"{k}={v}" for k, v in sorted(r.by_kind.items())),
             f"server outcomes: {_fmt_outcomes(r.outcome_deltas)}; /health failures {r.health_failures}",
             f"idle: running {idle.get('num_running_reqs')}, waiting {idle.get('num_waiting_reqs')},"
             f" front-end samples {idle.get('tokenizer_inflight_samples')}, "
             f"invariants_ok {idle.get('invariants_ok')}, unfinished handles "
             f"{idle.get('unfinished_handles')}, collected unfinished "
             f"{idle.get('collected_unfinished_handles')}",
             f"rss: baseline {r.rss_baseline_bytes / 2**20:.0f} MiB, "
             f"after {r.rss_after_bytes / 2**20:.0f} MiB "
             f"(margin max({RSS_MARGIN_FRAC:.0%}, {RSS_MARGIN_BYTES // 2**20} MiB)"
             f" + lazily committed CPU KV pool {r.lazy_pool_bytes / 2**20:.0f} MiB)",
             "PASS" if not r.problems else "FAIL:\n  " + "\n  ".join(r.problems)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", help="a running server (else --launch starts one)")
    ap.add_argument("--launch", action="store_true", help="start `radixrt launch-server` on the default "
                    "model with RADIXRT_DEBUG_INVARIANTS=1; extra server flags after `--`")
    ap.add_argument("--pid", type=int, help="the server launcher's pid (memory check) with --base-url")
    ap.add_argument("--api-key")
    ap.add_argument("--json", type=Path, help="write the report here")
    for f, default in asdict(SoakConfig()).items():
        ap.add_argument("--" + f.replace("_", "-"), type=type(default), default=default)
    ap.add_argument("server_args", nargs="*")
    ns = ap.parse_args(argv)
    cfg = SoakConfig(**{f: getattr(ns, f) for f in asdict(SoakConfig())})
    server = None
    if ns.launch:
        import tempfile

        from bench.server_proc import start_server
        from radixrt.config import Env
        from radixrt.models.loader import resolve_model_dir

        model = Path(ns.server_args[ns.server_args.index("--model-path") + 1]) if (
            "--model-path" in ns.server_args) else resolve_model_dir(None, Env.read().cache_dir, "auto")
        extra = [a for i, a in enumerate(ns.server_args) if a != "--model-path" and (
            i == 0 or ns.server_args[i - 1] != "--model-path")]
        device = "cuda" if "cuda" in extra else "cpu"
        extra = [a for a in extra if a not in ("--device", device)]
        server = start_server(model, Path(tempfile.mkdtemp()), *extra, device=device, timeout_s=900,
                              env={"RADIXRT_DEBUG_INVARIANTS": "1"})
        ns.base_url, ns.pid = server.base_url, server.proc.pid
        print(f"soak: server up at {ns.base_url}", flush=True)
    try:
        report = asyncio.run(soak(ns.base_url, cfg, ns.pid, ns.api_key))
    finally:
        if server is not None:
            server.stop()
    print(format_report(report))
    if ns.json:
        ns.json.write_text(orjson.dumps(asdict(report), option=orjson.OPT_INDENT_2).decode())
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
