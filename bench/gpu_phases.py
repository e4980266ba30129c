"""The phases of bench/gpu_serving.py against one running server, their sizes, and the final table.

Each phase is `fn(res)` filling the dict `res` as it goes, so a phase cut short keeps what it
finished. Sizes: FULL (H200, Qwen2.5-7B shape) and SMALL (CPU smoke test).
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.long_short import LongShortParams, run_long_short
from bench.server_stats import KVWastePoller, kv_waste_summary, scheduler_delta, scheduler_info, wait_idle
from bench.serving import BenchConfig, run_benchmark
from bench.workloads import WorkloadSpec

TPOT_B1_GOAL_MS = 4.1
RUN_KEYS = ("max_concurrency", "num_requests", "completed", "failed", "errors", "duration_s",
            "request_throughput",
            "input_throughput", "output_throughput", "total_output_tokens", "token_counts_consistent",
            "output_len_mismatches", "cache_hit_rate", "mean_concurrency", "ttft_ms", "tpot_ms", "itl_ms",
            "e2e_ms")


@dataclass(slots=True)
class Sizes:
    long_short: LongShortParams
    batch: tuple[int, int, int, int]  # (num_prompts, input_len, output_len, max_concurrency)
    single: tuple[int, int, int, int]
    sweep: list[int]
    sweep_prompts: list[int]
    random_io: tuple[int, int]
    shared_prefix: dict = field(default_factory=dict)  # WorkloadSpec fields
    multi_turn: dict = field(default_factory=dict)
    warmup_shorts: int = 16


FULL = Sizes(long_short=LongShortParams(), batch=(128, 128, 256, 128), single=(8, 128, 128, 1),
             sweep=[1, 16, 64, 256], sweep_prompts=[8, 64, 128, 512], random_io=(512, 256),
             shared_prefix=dict(num_groups=1, prompts_per_group=128, system_prompt_len=2048, question_len=128,
                                output_len=64),
             multi_turn=dict(num_clients=16, num_turns=4, input_len=1024, turn_len=128, output_len=64))
SMALL = Sizes(long_short=LongShortParams(num_streams=4, stream_input_len=32, stream_max_tokens=2000,
                                         num_long=1, long_input_len=600, long_first_s=1.0, short_rate=1.0,
                                         short_input_len=16, short_output_len=4, duration_s=5.0,
                                         stream_start_timeout_s=30.0),
              batch=(8, 16, 16, 8), single=(2, 16, 8, 1), sweep=[1, 4], sweep_prompts=[2, 8],
              random_io=(32, 8),
              shared_prefix=dict(num_groups=1, prompts_per_group=8, system_prompt_len=64, question_len=16,
                                 output_len=4),
              multi_turn=dict(num_clients=2, num_turns=3, input_len=32, turn_len=8, output_len=4),
              warmup_shorts=4)


def sizes_dict(s: Sizes) -> dict:
    return asdict(s)


def _spec(vocab: int, **kw: Any) -> WorkloadSpec:
    return WorkloadSpec(vocab_size=vocab, min_token_id=min(1000, vocab // 2), **kw)


def _bench(url: str, spec: WorkloadSpec, timeout_s: float, **kw: Any) -> dict:
    return run_benchmark(BenchConfig(base_url=url, workload=spec, disable_tqdm=True, flush_cache=True,
                                     timeout_s=timeout_s, **kw))


def _run_fields(run: dict) -> dict:
    return {k: run.get(k) for k in RUN_KEYS}


def warmup(url: str, s: Sizes, vocab: int, with_long: bool, res: dict) -> None:
    """One long prompt (if the long/short phase follows) beside a burst of short ones, then flush."""
    rng = np.random.default_rng(99)
    lo = min(1000, vocab // 2)
    lens = ([s.long_short.long_input_len] if with_long else []) + [128] * s.warmup_shorts
    model = httpx.get(url + "/v1/models", timeout=30, trust_env=False).json()["data"][0]["id"]

    def one(n: int) -> int:
        body = {"model": model, "prompt": rng.integers(lo, vocab, size=n).tolist(), "max_tokens": 4,
                "ignore_eos": True, "temperature": 0.0}
        return httpx.post(url + "/v1/completions", json=body, timeout=300, trust_env=False).status_code

    with cf.ThreadPoolExecutor(max_workers=len(lens)) as ex:
        codes = list(ex.map(one, lens))
    res["prompt_lens"], res["status_codes"] = lens, codes
    res["flush_cache"] = httpx.post(url + "/flush_cache", timeout=60, trust_env=False).status_code
    if any(c != 200 for c in codes):
        raise RuntimeError(f"warm-up requests failed: HTTP {codes}")


def long_short(url: str, s: Sizes, vocab: int, deadline_s: float, res: dict) -> None:
    params = replace(s.long_short, vocab_size=vocab, min_token_id=min(1000, vocab // 2))
    before = scheduler_info(url)
    summary, samples = run_long_short(url, params, deadline_s=max(deadline_s - 15, 10))
    res.update(summary)
    res["drain_s"] = wait_idle(url, timeout_s=15)  # None: the cancelled streams were not aborted
    res["scheduler"] = scheduler_delta(before, scheduler_info(url))
    res["samples"] = samples


def overlap(url: str, s: Sizes, vocab: int, res: dict) -> None:
    for name, (n, n_in, n_out, conc), seed in (("batch", s.batch, 11), ("batch1", s.single, 12)):
        before = scheduler_info(url)
        spec = _spec(vocab, name="random", num_prompts=n, input_len=n_in, output_len=n_out, seed=seed)
        run = _bench(url, spec, 120, max_concurrency=conc)["runs"][0]
        res[name] = {"num_prompts": n, "input_len": n_in, "output_len": n_out, **_run_fields(run),
                     "scheduler": scheduler_delta(before, scheduler_info(url))}
    tpot = res["batch1"]["tpot_ms"]["median"]
    res["batch1"].update(goal_tpot_ms=TPOT_B1_GOAL_MS,
                         meets_goal=tpot is not None and tpot <= TPOT_B1_GOAL_MS)


def throughput(url: str, s: Sizes, vocab: int, out_dir: Path, res: dict) -> None:
    n_in, n_out = s.random_io
    spec = _spec(vocab, name="random", input_len=n_in, output_len=n_out, range_ratio=1.0, seed=21)
    before = scheduler_info(url)
    poller = KVWastePoller(url, 0.5).start()
    try:
        rep = _bench(url, spec, 300, concurrency_sweep=s.sweep, sweep_num_prompts=s.sweep_prompts,
                     plot_dir=str(out_dir))
    finally:
        samples = poller.stop()
    res["random"] = {"input_len": n_in, "output_len": n_out, "runs": [_run_fields(r) for r in rep["runs"]],
                     "plots": rep["plots"], "kv_waste": kv_waste_summary(samples),
                     "scheduler": scheduler_delta(before, scheduler_info(url))}
    for name, kw, seed in (("shared-prefix", s.shared_prefix, 31), ("multi-turn", s.multi_turn, 41)):
        before = scheduler_info(url)
        run = _bench(url, _spec(vocab, name=name, seed=seed, **kw), 300)["runs"][0]
        res[name] = {**kw, **_run_fields(run), "scheduler": scheduler_delta(before, scheduler_info(url))}


def phase_fn(phase: str, url: str, s: Sizes, vocab: int, out_dir: Path, deadline_s: float,
             with_long: bool = True) -> Any:
    """fn(res) running `phase` against the server at url (warmup: with a long prompt if with_long)."""
    return {"warmup": lambda res: warmup(url, s, vocab, with_long, res),
            "long_short": lambda res: long_short(url, s, vocab, deadline_s, res),
            "overlap": lambda res: overlap(url, s, vocab, res),
            "throughput": lambda res: throughput(url, s, vocab, out_dir, res)}[phase]


def plot_long_short(samples: dict[str, dict], out_dir: Path) -> str | None:
    try:
        from bench.plots import plot_long_short as plot

        return str(plot(samples, Path(out_dir) / "long_short.png"))
    except Exception as e:  # noqa: BLE001 - a plot must not lose the measurements
        return f"plot failed: {type(e).__name__}: {e}"


# ----------------------------------------------------------------------------- summary


def _g(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def summary_rows(report: dict) -> list[dict]:
    """One flat row per (config, measurement) with the headline figures (ms, tok/s, fractions)."""
    rows = []
    for name, c in report.get("configs", {}).items():
        ph = c.get("phases", {})
        ls = ph.get("long_short") or {}
        if "short" in ls:
            rows.append({"config": name, "what": "long_short", "flags": " ".join(c["flags"]) or "(defaults)",
                         "short_ttft_p50": _g(ls, "short", "ttft_ms", "median"),
                         "short_ttft_p90": _g(ls, "short", "ttft_ms", "p90"),
                         "short_ttft_p99": _g(ls, "short", "ttft_ms", "p99"),
                         "short_ok": f"{_g(ls, 'short', 'completed')}/{_g(ls, 'short', 'sent')}",
                         "stream_itl_p50": _g(ls, "streams", "itl_ms", "median"),
                         "stream_itl_p99": _g(ls, "streams", "itl_ms", "p99"),
                         "stream_itl_max": _g(ls, "streams", "itl_ms", "max"),
                         "long_ttft": _g(ls, "long", "ttft_ms"), "errors": len(ls.get("errors") or []),
                         "meets_goal": ls.get("meets_goal")})
        ov = ph.get("overlap") or {}
        for key in ("batch", "batch1"):
            if key in ov:
                r = ov[key]
                rows.append({"config": name, "what": f"overlap {key}",
                             "flags": " ".join(c["flags"]) or "(defaults)",
                             "output_tok_s": r.get("output_throughput"), "itl_p50": _g(r, "itl_ms", "median"),
                             "itl_p99": _g(r, "itl_ms", "p99"), "tpot_p50": _g(r, "tpot_ms", "median"),
                             "tpot_p99": _g(r, "tpot_ms", "p99"),
                             "gpu_idle_fraction": _g(r, "scheduler", "gpu_idle_fraction"),
                             "forward_ms_mean": _g(r, "scheduler", "forward_ms_mean"),
                             "schedule_ms_mean": _g(r, "scheduler", "schedule_ms_mean"),
                             "result_wait_ms_mean": _g(r, "scheduler", "result_wait_ms_mean"),
                             "failed": r.get("failed")})
        tp = ph.get("throughput") or {}
        for run in _g(tp, "random", "runs") or []:
            rows.append({"config": name, "what": f"random c={run['max_concurrency']}",
                         "output_tok_s": run["output_throughput"], "ttft_p50": _g(run, "ttft_ms", "median"),
                         "tpot_p50": _g(run, "tpot_ms", "median"), "failed": run["failed"]})
        if "random" in tp:
            w = tp["random"]["kv_waste"]
            rows.append({"config": name, "what": "kv waste (random sweep)",
                         "time_avg": w["time_avg_unused_fraction"],
                         "aggregate": w["aggregate_unused_fraction"],
                         "meets_goal": w["meets_goal"]})
        for wl in ("shared-prefix", "multi-turn"):
            if wl in tp:
                r = tp[wl]
                rows.append({"config": name, "what": wl, "output_tok_s": r["output_throughput"],
                             "cache_hit_rate": r["cache_hit_rate"], "ttft_p50": _g(r, "ttft_ms", "median"),
                             "failed": r["failed"]})
    return rows


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1 else f"{v:.1f}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return "-" if v is None else str(v)


def format_table(report: dict) -> str:
    lines = [f"gpu_serving: {report.get('gpu') or 'no GPU name'}; small={report.get('small')}"]
    for name, c in report.get("configs", {}).items():
        status = c.get("skipped") or ("; ".join(c.get("errors") or []) or "ok")
        lines.append(f"config {name} ({c.get('description')}): start {_fmt(c.get('server_start_s'))} s; "
                     f"{status}")
    for row in report.get("summary", []):
        rest = "  ".join(f"{k}={_fmt(v)}" for k, v in row.items() if k not in ("config", "what"))
        lines.append(f"  {row['config']} {row['what']:<26s} {rest}")
    return "\n".join(lines)
