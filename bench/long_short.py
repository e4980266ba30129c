"""Long prompts arriving while streams decode and short requests come in (the chunked-prefill scenario).

`run_long_short(base_url, params)`:
  1. `num_streams` streaming requests start (random `stream_input_len`-token prompts, `max_tokens`
     long enough to outlast the phase) and are waited for until each has its first token;
  2. the measurement window opens: `num_long` prompts of `long_input_len` tokens arrive every
     `long_interval_s` (the first after `long_first_s`), with 1..`long_max_output` output tokens, and
     short requests (`short_input_len` in / `short_output_len` out) arrive by a Poisson process of
     `short_rate` per second during `duration_s`;
  3. once every long and short request is done and `duration_s` has passed (or the phase deadline
     passes), the window closes and the streams are cancelled (the client disconnects; the server
     aborts them).

Reported (`summarize_long_short`, ms): TTFT of the short requests, inter-token gaps of the streams
inside the window (ITL: one per output chunk whose previous chunk also fell in the window), TTFT
and e2e of each long prompt, streams that ended early, errors. Every prompt is fresh random ids, so
nothing hits the prefix cache.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

import httpx
import numpy as np

from bench.serving import BenchConfig, send_request
from bench.serving_metrics import MAX_ERRORS_KEPT, RequestOutcome, latency_stats_ms

SHORT_TTFT_GOAL_MS = 200.0  # issue 19: short-request p99 TTFT beside 32K prefills


@dataclass(slots=True)
class LongShortParams:
    num_streams: int = 64
    stream_input_len: int = 256
    stream_max_tokens: int = 6000  # outlasts the window; the streams are cancelled when it closes
    num_long: int = 3
    long_input_len: int = 32000
    long_max_output: int = 8  # each long prompt asks for 1..long_max_output tokens
    long_first_s: float = 1.0
    long_interval_s: float = 4.0
    short_rate: float = 4.0  # per second, Poisson
    short_input_len: int = 128
    short_output_len: int = 16
    duration_s: float = 15.0  # shorts arrive during this window
    stream_start_timeout_s: float = 60.0
    vocab_size: int = 150000
    min_token_id: int = 1000
    seed: int = 0


def short_offsets(rate: float, duration_s: float, rng: np.random.Generator) -> list[float]:
    """Poisson arrival offsets (s) in [0, duration_s)."""
    out, t = [], 0.0
    while True:
        t += rng.exponential(1.0 / rate)
        if t >= duration_s:
            return out
        out.append(t)


def window_gaps_s(chunk_times: list[float], t0: float, t1: float) -> list[float]:
    """Gaps between consecutive chunk arrivals that both lie in [t0, t1]."""
    inside = [t for t in chunk_times if t0 <= t <= t1]
    return [b - a for a, b in zip(inside, inside[1:], strict=False)]


def summarize_long_short(streams: list[RequestOutcome], longs: list[RequestOutcome],
                         shorts: list[RequestOutcome],
                         t0: float, t1: float, timed_out: bool = False) -> dict:
    """Phase metrics from outcomes; streams need chunk_times_s; t0/t1: the window (perf_counter s)."""
    gaps = [g for s in streams for g in window_gaps_s(s.chunk_times_s or [], t0, t1)]
    ended_early = [s for s in streams if s.e2e_s is not None and s.start_s + s.e2e_s < t1]
    stream_errors = [s.error for s in streams if s.error]
    window = max(t1 - t0, 1e-9)
    in_window = sum(sum(t0 <= t <= t1 for t in (s.chunk_times_s or [])) for s in streams)
    short_ok = [o for o in shorts if o.ok]
    long_ok = [o for o in longs if o.ok]
    errors = [o.error for o in [*shorts, *longs] if o.error][:MAX_ERRORS_KEPT]
    errors += stream_errors[:MAX_ERRORS_KEPT]
    short_ttft = latency_stats_ms([o.ttft_s for o in short_ok if o.ttft_s is not None])
    gaps_ms = np.asarray(gaps) * 1e3
    return {
        "window_s": t1 - t0,
        "timed_out": timed_out,
        "short": {"sent": len(shorts), "completed": len(short_ok), "failed": len(shorts) - len(short_ok),
                  "ttft_ms": short_ttft, "e2e_ms": latency_stats_ms([o.e2e_s for o in short_ok]),
                  "samples": [[round(o.start_s - t0, 4), round(o.ttft_s * 1e3, 3)]
                              for o in short_ok if o.ttft_s is not None]},
        "streams": {"count": len(streams), "ended_early": len(ended_early), "errors": len(stream_errors),
                    "itl_ms": latency_stats_ms(gaps), "chunks_in_window": int(in_window),
                    "chunks_per_s": in_window / window,
                    "itl_over_100ms": float((gaps_ms > 100).mean()) if gaps else None,
                    "itl_over_300ms": float((gaps_ms > 300).mean()) if gaps else None},
        "long": {"sent": len(longs), "completed": len(long_ok), "failed": len(longs) - len(long_ok),
                 "prompt_len": [o.prompt_len for o in longs],
                 "send_offset_s": [round(o.start_s - t0, 4) for o in longs],
                 "ttft_ms": [None if o.ttft_s is None else o.ttft_s * 1e3 for o in longs],
                 "e2e_ms": [None if o.e2e_s is None else o.e2e_s * 1e3 for o in longs]},
        "errors": errors,
        "goal_short_p99_ttft_ms": SHORT_TTFT_GOAL_MS,
        "meets_goal": short_ttft["p99"] is not None and short_ttft["p99"] < SHORT_TTFT_GOAL_MS
                      and len(short_ok) == len(shorts),
    }


async def _at(t: float, coro_fn, *args) -> RequestOutcome:
    delay = t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    return await coro_fn(*args)


async def _run(base_url: str, p: LongShortParams, deadline_s: float) -> tuple[dict, dict]:
    cfg = BenchConfig(base_url=base_url, timeout_s=max(deadline_s, 30.0))
    rng = np.random.default_rng([p.seed, 0x10C5])

    def ids(n: int) -> list[int]:
        return rng.integers(p.min_token_id, p.vocab_size, size=n).tolist()

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(cfg.timeout_s), limits=limits,
                                 trust_env=False) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        end_by = time.perf_counter() + deadline_s

        async def go(out: RequestOutcome, prompt: list[int]) -> RequestOutcome:
            return await send_request(client, cfg, model, out, prompt)

        streams = [RequestOutcome(i, 0, p.stream_input_len, p.stream_max_tokens, chunk_times_s=[])
                   for i in range(p.num_streams)]
        stream_tasks = [asyncio.create_task(go(o, ids(p.stream_input_len))) for o in streams]
        t_start = time.perf_counter()
        while any(o.ttft_s is None and o.error is None for o in streams):
            if time.perf_counter() - t_start > p.stream_start_timeout_s:
                break
            await asyncio.sleep(0.02)
        t0 = time.perf_counter()
        longs, shorts, tasks = [], [], []
        for k in range(p.num_long):
            o = RequestOutcome(1000 + k, 0, p.long_input_len, int(rng.integers(1, p.long_max_output + 1)))
            longs.append(o)
            tasks.append(_at(t0 + p.long_first_s + k * p.long_interval_s, go, o, ids(p.long_input_len)))
        for k, off in enumerate(short_offsets(p.short_rate, p.duration_s, rng)):
            o = RequestOutcome(2000 + k, 0, p.short_input_len, p.short_output_len)
            shorts.append(o)
            tasks.append(_at(t0 + off, go, o, ids(p.short_input_len)))
        pending = [asyncio.create_task(t) for t in tasks]
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.gather(*pending), timeout=max(end_by - time.perf_counter(), 1.0))
        except asyncio.TimeoutError:
            timed_out = True
        rest = min(t0 + p.duration_s, end_by) - time.perf_counter()
        if rest > 0:  # the window lasts at least duration_s
            await asyncio.sleep(rest)
        t1 = time.perf_counter()
        for t in [*pending, *stream_tasks]:
            t.cancel()
        await asyncio.gather(*pending, *stream_tasks, return_exceptions=True)
    for o in [*longs, *shorts]:
        if not o.ok and o.error is None:
            o.error = "not finished when the phase ended"
    summary = summarize_long_short(streams, longs, shorts, t0, t1, timed_out)
    summary["params"] = asdict(p)
    summary["stream_start_s"] = t0 - t_start
    samples = {"short_send_s": [o.start_s - t0 for o in shorts if o.ok and o.ttft_s is not None],
               "short_ttft_ms": [o.ttft_s * 1e3 for o in shorts if o.ok and o.ttft_s is not None],
               "long_send_s": [o.start_s - t0 for o in longs],
               "itl_ms": [g * 1e3 for s in streams for g in window_gaps_s(s.chunk_times_s or [], t0, t1)]}
    return summary, samples


def run_long_short(base_url: str, params: LongShortParams, deadline_s: float = 120.0) -> tuple[dict, dict]:
    """Run the scenario; returns (summary dict for the JSON report, raw samples for plots)."""
    return asyncio.run(_run(base_url, params, deadline_s))
