"""Issue 19 part 3 in one call: is the HTTP serving path as fast as the Engine? One table of goal ratios.

    python3 bench/serving_goals.py --out $OUT/serving-goals.json                 # H200, ~300 s
    python3 bench/serving_goals.py --small --out /tmp/sg.json                   # CPU smoke test

Two parts, one after the other on the same device and the same dummy-weights model directory
(bench/dummy_tokenizer.py over --config-dir, Qwen2.5-7B shape by default):

1. Engine (a child process, so its device memory is gone before the server starts): `random`
   256 x 512/256, `shared-prefix` 128 x (2,048 + 128)/64, `multi-turn` 16 x 4 turns (1,024 + 128
   per turn)/64, each after a small warm-up of the same workload; output tok/s (bench/offline.py).
2. `radixrt launch-server` with default flags (+ --load-format dummy --max-running-requests 256, as
   the Engine): the same three workloads through HTTP at unlimited concurrency (bench/serving.py,
   cache flushed before each); `random` 512/256 TTFT at concurrency 1 (8 requests) and 16 (64
   requests), the latter both as a burst (all 16 sessions start at once, so the closed loop runs in
   lockstep waves) and ramped (the first 16 start over one request's e2e at concurrency 1: steady
   state); then the long/short scenario of bench/long_short.py (64 streams, 32K prompts every 4 s,
   Poisson short requests), short-request p99 TTFT.

Goals: HTTP / Engine output tok/s >= 0.95 on each workload; TTFT p50 at c16 <= 2x c1; short p99
TTFT < 200 ms beside 32K prefills with the default config. JSON after each step (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.dummy_tokenizer import make_dummy_model_dir  # noqa: E402
from bench.workloads import WorkloadSpec  # noqa: E402

RATIO_GOAL = 0.95
TTFT_RATIO_GOAL = 2.0
SHORT_P99_GOAL_MS = 200.0


def workloads(small: bool, vocab: int) -> list[WorkloadSpec]:
    """The three throughput workloads of bench/gpu_engine.py (SMALL: CPU sizes)."""
    lo = min(1000, vocab // 2)
    kw = dict(vocab_size=vocab, min_token_id=lo)
    if small:
        return [WorkloadSpec(name="random", num_prompts=8, input_len=32, output_len=8, **kw),
                WorkloadSpec(name="shared-prefix", prompts_per_group=8, system_prompt_len=64, question_len=16,
                             output_len=4, **kw),
                WorkloadSpec(name="multi-turn", num_clients=2, num_turns=3, input_len=32, turn_len=8,
                             output_len=4, **kw)]
    return [WorkloadSpec(name="random", num_prompts=256, input_len=512, output_len=256, **kw),
            WorkloadSpec(name="shared-prefix", num_groups=1, prompts_per_group=128, system_prompt_len=2048,
                         question_len=128, output_len=64, **kw),
            WorkloadSpec(name="multi-turn", num_clients=16, num_turns=4, input_len=1024, turn_len=128,
                         output_len=64, **kw)]


def _warm_spec(spec: WorkloadSpec) -> WorkloadSpec:
    return replace(spec, seed=spec.seed + 1000, num_prompts=min(spec.num_prompts, 4),
                   prompts_per_group=min(spec.prompts_per_group, 4), num_clients=min(spec.num_clients, 2),
                   num_turns=min(spec.num_turns, 2), output_len=min(spec.output_len, 8))


# ----------------------------------------------------------------------------- part 1: Engine


def engine_part(model_dir: str, device: str, small: bool) -> dict[str, Any]:
    """Output tok/s of each workload through radixrt.Engine (default chunking, as the server)."""
    from bench.offline import run_workload
    from radixrt.engine import Engine

    t0 = time.perf_counter()
    engine = Engine(model_path=model_dir, load_format="dummy", device=device, max_running_requests=256,
                    max_total_tokens=None if device == "cuda" else 65536)
    out: dict[str, Any] = {"start_s": time.perf_counter() - t0}
    vocab = int(engine.info["vocab_size"])
    for spec in workloads(small, vocab):
        run_workload(engine, _warm_spec(spec).build())
        engine.scheduler.flush_cache()
        t0 = time.perf_counter()
        r = run_workload(engine, spec.build())
        window = [t0, time.perf_counter()]  # perf_counter s, for the pass trace (bench/lab/pass_timeline.py)
        engine.scheduler.flush_cache()
        out[spec.name] = {k: r[k] for k in ("wall_s", "output_throughput", "cache_hit_rate",
                                            "token_counts_consistent")}
        out[spec.name]["window"] = window
        print(f"engine {spec.name}: {r['output_throughput']:.0f} out tok/s", flush=True)
    return out


# ----------------------------------------------------------------------------- part 2: HTTP


def _bench(url: str, spec: WorkloadSpec, **kw: Any) -> dict[str, Any]:
    from bench.serving import BenchConfig, run_benchmark

    rep = run_benchmark(BenchConfig(base_url=url, workload=spec, disable_tqdm=True, flush_cache=True,
                                    timeout_s=300, **kw))
    return rep["runs"][0]


def _pick(run: dict[str, Any]) -> dict[str, Any]:
    keys = ("output_throughput", "duration_s", "cache_hit_rate", "failed", "ttft_ms", "e2e_ms", "tpot_ms")
    return {k: run.get(k) for k in keys}


def http_part(url: str, small: bool, vocab: int, res: dict[str, Any], save: Any,
              throughput_only: bool = False, transport: str = "raw", connections: str = "keep-alive") -> None:
    """Throughput of the three workloads, then (unless throughput_only) TTFT at c1 / c16 (burst
    and ramped) and long/short; `transport` / `connections`: the load generator's client
    (BenchConfig.transport / .connections)."""
    from bench import gpu_phases
    from bench.server_stats import wait_idle

    bench = partial(_bench, transport=transport, connections=connections)

    sizes = gpu_phases.SMALL if small else gpu_phases.FULL
    gpu_phases.warmup(url, sizes, vocab, True, res.setdefault("warmup", {}))
    for spec in workloads(small, vocab):
        bench(url, _warm_spec(spec))
        run = bench(url, spec)
        res[spec.name] = _pick(run)
        t0 = run["start_perf_s"]  # the load generator's clock: after its flush and warm-up request
        res[spec.name]["window"] = [t0, t0 + run["duration_s"]]  # perf_counter s, for the pass trace
        print(f"http {spec.name}: {res[spec.name]['output_throughput']:.0f} out tok/s", flush=True)
        save()
    if throughput_only:
        return
    n_in, n_out = sizes.random_io
    c1_n, c16_n, c16 = (2, 8, 4) if small else (8, 64, 16)
    spec = WorkloadSpec(name="random", input_len=n_in, output_len=n_out, vocab_size=vocab,
                        min_token_id=min(1000, vocab // 2), seed=51)
    res["ttft_c1"] = _pick(bench(url, replace(spec, num_prompts=c1_n), max_concurrency=1))
    e2e_c1_s = (res["ttft_c1"]["e2e_ms"] or {}).get("median") or 1000.0
    res["ttft_c16_burst"] = _pick(bench(url, replace(spec, num_prompts=c16_n, seed=52), max_concurrency=c16))
    res["ttft_c16_ramped"] = _pick(bench(url, replace(spec, num_prompts=c16_n, seed=53), max_concurrency=c16,
                                          ramp_up_s=e2e_c1_s / 1e3))
    res["ttft_c16_ramped"]["ramp_up_s"] = e2e_c1_s / 1e3
    save()
    wait_idle(url, 30)
    ls: dict[str, Any] = {}
    gpu_phases.long_short(url, sizes, vocab, 60.0 if small else 90.0, ls)
    ls.pop("samples", None)
    res["long_short"] = ls
    save()


# ----------------------------------------------------------------------------- table


def _g(d: Any, *keys: str) -> Any:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def goal_rows(report: dict[str, Any]) -> list[tuple[str, Any, Any, str, bool | None]]:
    """(what, measured, reference, goal, met) per goal."""
    eng, http = report.get("engine") or {}, report.get("http") or {}
    rows: list[tuple[str, Any, Any, str, bool | None]] = []
    for name in ("random", "shared-prefix", "multi-turn"):
        h, e = _g(http, name, "output_throughput"), _g(eng, name, "output_throughput")
        ratio = h / e if h and e else None
        rows.append((f"{name}: HTTP / Engine out tok/s", h, e, f"ratio >= {RATIO_GOAL}",
                     None if ratio is None else ratio >= RATIO_GOAL))
    c1 = _g(http, "ttft_c1", "ttft_ms", "median")
    for key in ("ttft_c16_burst", "ttft_c16_ramped"):
        c16 = _g(http, key, "ttft_ms", "median")
        rows.append((f"random TTFT p50 {key[5:]} / c1 (ms)", c16, c1, f"ratio <= {TTFT_RATIO_GOAL}",
                     None if not (c1 and c16) else c16 / c1 <= TTFT_RATIO_GOAL))
    p99 = _g(http, "long_short", "short", "ttft_ms", "p99")
    rows.append(("short TTFT p99 beside 32K prefills (ms)", p99, None, f"< {SHORT_P99_GOAL_MS:.0f} ms",
                 None if p99 is None else p99 < SHORT_P99_GOAL_MS))
    # what the short p99 costs the long prompts (adaptive chunking cuts their passes): no goal
    long_ttft = [t for t in _g(http, "long_short", "long", "ttft_ms") or [] if t is not None]
    rows.append(("32K-prompt TTFT max beside the streams (ms)", max(long_ttft) if long_ttft else None, None,
                 "(reported)", None))
    return rows


def format_table(report: dict[str, Any]) -> str:
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:,.1f}" if isinstance(v, float) else str(v)

    lines = [f"{'goal':44s} {'measured':>10s} {'reference':>10s} {'ratio':>7s}  {'goal':14s} met"]
    for what, m, ref, goal, met in goal_rows(report):
        both = isinstance(m, int | float) and isinstance(ref, int | float) and ref
        ratio = f"{m / ref:.3f}" if both else "-"
        lines.append(f"{what:44s} {f(m):>10s} {f(ref):>10s} {ratio:>7s}  {goal:14s} {f(met)}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON report path")
    p.add_argument("--config-dir", default=None, help="dir with config.json (default: Qwen2.5-7B shape; "
                                                      "--small: the default model's)")
    p.add_argument("--small", action="store_true", help="tiny sizes on the CPU (smoke test)")
    p.add_argument("--device", default=None, help="default: cuda (cpu with --small)")
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument("--throughput-only", action="store_true", help="only the three throughput workloads")
    p.add_argument("--transport", choices=["raw", "httpx"], default="raw",
                   help="the load generator's HTTP client (bench/serving.py BenchConfig.transport)")
    p.add_argument("--connections", choices=["keep-alive", "close"], default="keep-alive",
                   help="the load generator's connections (bench/serving.py BenchConfig.connections)")
    p.add_argument("--trace-dir", default=None, help="RADIXRT_PASS_TRACE of the Engine (DIR/engine.jsonl) "
                                                     "and of the server (DIR/server.jsonl)")
    p.add_argument("--role", choices=["engine"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    ns.device = ns.device or ("cpu" if ns.small else "cuda")
    return ns


def _run_engine_child(ns: argparse.Namespace, model_dir: Path, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--role", "engine", "--model-dir", str(model_dir), "--out", str(out),
           "--device", ns.device, *(["--small"] if ns.small else [])]
    env = dict(os.environ)
    if ns.trace_dir:
        Path(ns.trace_dir).mkdir(parents=True, exist_ok=True)
        env["RADIXRT_PASS_TRACE"] = str(Path(ns.trace_dir) / "engine.jsonl")
    r = subprocess.run(cmd, cwd=ROOT, timeout=280 if not ns.small else 600, env=env)
    if r.returncode != 0 or not out.exists():
        return {"error": f"engine part exited with {r.returncode}"}
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    if ns.role == "engine":
        Path(ns.out).write_text(json.dumps(engine_part(ns.model_dir, ns.device, ns.small), default=str))
        return 0
    from bench.gpu_serving import ServerProc, _default_config_dir, server_cwd

    tmp = Path(tempfile.mkdtemp(prefix="serving_goals_"))
    model_dir = make_dummy_model_dir(ns.config_dir or _default_config_dir(ns.small), tmp / "model")
    report: dict[str, Any] = {"tool": "bench/serving_goals.py", "small": ns.small, "device": ns.device,
                              "transport": ns.transport, "connections": ns.connections}
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out.write_text(json.dumps(report, indent=1, default=str))

    t0 = time.monotonic()
    if not ns.skip_engine:
        report["engine"] = _run_engine_child(ns, model_dir, tmp / "engine.json")
        save()
    flags = ["--model-path", str(model_dir), "--load-format", "dummy", "--device", ns.device,
             "--max-running-requests", "256"]
    if ns.trace_dir:
        Path(ns.trace_dir).mkdir(parents=True, exist_ok=True)
        os.environ["RADIXRT_PASS_TRACE"] = str(Path(ns.trace_dir) / "server.jsonl")  # the server inherits it
    server = ServerProc(flags, server_cwd(tmp), tmp / "server.log")
    os.environ.pop("RADIXRT_PASS_TRACE", None)
    report["http"] = http = {}
    try:
        server.wait_healthy(120 if ns.small else 300)
        import httpx

        info = httpx.get(server.url + "/get_server_info", timeout=30, trust_env=False).json()
        vocab = int(info["worker"]["vocab_size"])
        http["chunked_prefill_size"] = info["scheduler"].get("chunked_prefill_size")
        http_part(server.url, ns.small, vocab, http, save, ns.throughput_only, ns.transport, ns.connections)
    except Exception as e:  # noqa: BLE001 - keep what was measured
        http["error"] = f"{type(e).__name__}: {e}"
        http["server_log_tail"] = server.log_tail()
    finally:
        server.stop()
    report["wall_s"] = time.monotonic() - t0
    report["goals"] = [dict(zip(("what", "measured", "reference", "goal", "met"), r, strict=True))
                       for r in goal_rows(report)]
    save()
    print(format_table(report), flush=True)
    print(f"wrote {out} ({report['wall_s']:.0f} s)", flush=True)
    return 0 if "error" not in http and "error" not in report.get("engine", {}) else 1


if __name__ == "__main__":
    sys.exit(main())
