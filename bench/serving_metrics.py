"""Serving benchmark metrics: per-request outcomes, SSE event folding, run summaries, the text report.

Metric definitions are in bench/serving.py's docstring; everything here is pure Python over timings,
so bench/gpu_serving.py and the tests use it without a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_ERRORS_KEPT = 5
LATENCY_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
RUN_FIELDS = (
    "max_concurrency", "request_rate", "num_requests", "completed", "failed", "errors", "duration_s",
    "request_throughput", "input_throughput", "output_throughput", "total_token_throughput",
    "total_input_tokens", "total_output_tokens", "total_output_tokens_stream", "total_output_tokens_usage",
    "usage_missing", "token_count_mismatches", "token_counts_consistent", "output_len_mismatches",
    "prompt_len_mismatches", "cached_tokens", "cache_hit_rate", "mean_concurrency", "answer_ids_source",
    "workload_seed",
    *LATENCY_KEYS,
)
STAT_FIELDS = ("mean", "median", "p90", "p99", "min", "max", "count")


@dataclass(slots=True)
class RequestOutcome:
    """What one streamed request produced; times in seconds (time.perf_counter)."""

    session_id: int
    turn: int
    prompt_len: int
    output_len: int  # requested
    start_s: float = 0.0
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    stream_tokens: int = 0
    answer_ids: list[int] | None = None  # only when the server streams token_ids
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None
    chunk_times_s: list[float] | None = None  # arrival time of every output chunk, if set to a list

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None

    @property
    def output_tokens(self) -> int:
        """usage.completion_tokens when the server sent usage, else the stream count."""
        usage = self.usage_completion_tokens
        return usage if usage is not None else self.stream_tokens

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)



def _apply_event(out: RequestOutcome, obj: dict, now: float, last: list[float]) -> None:
    """Fold one SSE JSON event into `out`; `last` holds the time of the previous output chunk."""
    if "error" in obj:
        err = obj["error"]
        out.error = str(err.get("message", err) if isinstance(err, dict) else err)
        return
    for choice in obj.get("choices") or []:
        ids = choice.get("token_ids")
        lp_tokens = (choice.get("logprobs") or {}).get("tokens")
        if isinstance(ids, list):
            n = len(ids)
        elif isinstance(lp_tokens, list):  # legacy logprobs: one entry per token (send "logprobs": 0)
            n = len(lp_tokens)
        else:
            n = 1 if choice.get("text") else 0
        if isinstance(ids, list):
            out.answer_ids = (out.answer_ids or []) + ids
        if n == 0:
            continue
        out.stream_tokens += n
        if out.chunk_times_s is not None:
            out.chunk_times_s.append(now)
        if out.ttft_s is None:
            out.ttft_s = now - out.start_s
        else:
            out.itl_s.append(now - last[0])
        last[0] = now
    usage = obj.get("usage")
    if usage:
        out.usage_prompt_tokens = usage.get("prompt_tokens")
        out.usage_completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        out.cached_tokens = details.get("cached_tokens")



def latency_stats_ms(values_s: list[float]) -> dict:
    """mean / median / p90 / p99 / min / max in ms of values given in seconds (None when empty)."""
    if not values_s:
        return {k: (0 if k == "count" else None) for k in STAT_FIELDS}
    a = np.asarray(values_s, dtype=np.float64) * 1000.0
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "min": float(a.min()), "max": float(a.max()),
            "count": int(a.size)}


def _token_counts(ok: list[RequestOutcome]) -> dict:
    with_usage = [o for o in ok if o.usage_completion_tokens is not None]
    mismatches = sum(o.stream_tokens != o.usage_completion_tokens for o in with_usage)
    prompt_bad = sum(o.usage_prompt_tokens is not None and o.usage_prompt_tokens != o.prompt_len for o in ok)
    return {
        "total_output_tokens_stream": sum(o.stream_tokens for o in ok),
        "total_output_tokens_usage": (sum(o.usage_completion_tokens for o in with_usage) if with_usage
                                      else None),
        "usage_missing": len(ok) - len(with_usage),
        "token_count_mismatches": mismatches,
        "token_counts_consistent": mismatches == 0 and len(with_usage) == len(ok),
        "output_len_mismatches": sum(o.output_tokens != o.output_len for o in ok),
        "prompt_len_mismatches": prompt_bad,
    }


def summarize(outcomes: list[RequestOutcome], duration_s: float) -> dict:
    """Run metrics (see RUN_FIELDS) from per-request outcomes; throughputs in tok/s and req/s."""
    ok = [o for o in outcomes if o.ok]
    failed = [o for o in outcomes if not o.ok]
    input_tokens = sum(o.prompt_len for o in ok)
    output_tokens = sum(o.output_tokens for o in ok)
    cached = [o for o in ok if o.cached_tokens is not None and o.usage_prompt_tokens]
    cached_tokens = sum(o.cached_tokens for o in cached)
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    return {
        "num_requests": len(outcomes), "completed": len(ok), "failed": len(failed),
        "errors": [o.error for o in failed[:MAX_ERRORS_KEPT]], "duration_s": duration_s,
        "request_throughput": len(ok) * per_s, "input_throughput": input_tokens * per_s,
        "output_throughput": output_tokens * per_s,
        "total_token_throughput": (input_tokens + output_tokens) * per_s,
        "total_input_tokens": input_tokens, "total_output_tokens": output_tokens, **_token_counts(ok),
        "cached_tokens": cached_tokens,
        "cache_hit_rate": cached_tokens / sum(o.usage_prompt_tokens for o in cached) if cached else None,
        "mean_concurrency": sum(o.e2e_s for o in ok) * per_s, "answer_ids_source": None,
        "ttft_ms": latency_stats_ms([o.ttft_s for o in ok if o.ttft_s is not None]),
        "tpot_ms": latency_stats_ms([o.tpot_s for o in ok if o.tpot_s is not None]),
        "itl_ms": latency_stats_ms([g for o in ok for g in o.itl_s]),
        "e2e_ms": latency_stats_ms([o.e2e_s for o in ok]),
    }



def format_report(report: dict) -> str:
    """A human-readable table of every run (ms, tok/s)."""
    lines = [f"workload {report['workload']['name']}: {report['workload']['num_requests']} requests, "
             f"model {report['model']}"]
    for r in report["runs"]:
        hit = "n/a" if r["cache_hit_rate"] is None else f"{r['cache_hit_rate']:.1%}"
        lines.append(
            f"  concurrency {r['max_concurrency'] or 'inf'}: {r['completed']}/{r['num_requests']} ok in "
            f"{r['duration_s']:.2f} s | {r['request_throughput']:.2f} req/s | in {r['input_throughput']:.0f} "
            f"tok/s | out {r['output_throughput']:.0f} tok/s | cache hit {hit}")
        lat = " | ".join(f"{k[:-3].upper()} mean {_fmt(r[k]['mean'])} p50 {_fmt(r[k]['median'])} "
                         f"p99 {_fmt(r[k]['p99'])}" for k in LATENCY_KEYS)
        lines.append(f"    {lat} (ms)")
        if not r["token_counts_consistent"]:
            lines.append(f"    WARNING: stream token count != usage.completion_tokens in "
                         f"{r['token_count_mismatches']} requests ({r['usage_missing']} without usage)")
        if r["output_len_mismatches"]:
            lines.append(f"    WARNING: {r['output_len_mismatches']} requests did not produce their "
                         "output_len")
        for err in r["errors"]:
            lines.append(f"    error: {err}")
    return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"
