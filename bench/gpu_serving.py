"""One-call serving benchmark for a lent GPU: real `radixrt launch-server` processes, HTTP load.

    python3 bench/gpu_serving.py --out-dir $OUT/serving            # H200, Qwen2.5-7B shape, dummy weights
    python3 bench/gpu_serving.py --out-dir /tmp/gs --small          # CPU smoke test (SmolLM2 shape)

Builds a model directory with a stand-in tokenizer (bench/dummy_tokenizer.py) from --config-dir,
then for each server configuration starts a server (flags passed through, own process group,
waits for /health), warms it up, runs its phases, saves JSON after each phase and kills the server:

  config  server flags (+ common: --load-format dummy --max-running-requests 256)
          phases
  A       defaults: chunked prefill 8192 (CUDA), overlap scheduling on
          long_short, overlap, throughput
  B       --chunked-prefill-size 2048                        long_short
  C       --chunked-prefill-size -1 (no chunking)            long_short
  D       --disable-overlap-schedule                         overlap

Phases:
  long_short  64 decoding streams, 32,000-token prompts arriving every 4 s, Poisson short requests
              (bench/long_short.py): short TTFT p50/p90/p99 (goal p99 < 200 ms), stream ITL, long TTFT.
  overlap     128 concurrent requests 128 in / 256 out (tok/s, ITL, TPOT, scheduler timings and the
              GPU idle fraction from /get_server_info deltas), then batch 1, 128 in / 128 out
              (median TPOT; goal <= 4.1 ms).
  throughput  `random` 512/256 concurrency sweep 1, 16, 64, 256 (PNG plots) with KV waste polled
              every 0.5 s (goal < 4%), then `shared-prefix` and `multi-turn` at unlimited concurrency.

Configs run in the order A, B, D, C by default. Every phase has a hard timeout (the server is
killed if it hangs) and the whole run a budget (--budget-s); phases that would not fit are
recorded as skipped. Output: --out-dir/serving.json and
at most three PNGs (latency_cdf_random.png, concurrency_random.png, long_short.png).
"""

from __future__ import annotations

import argparse
import atexit
import copy
import ctypes
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench import gpu_phases  # noqa: E402
from bench.common import git_commit  # noqa: E402
from bench.dummy_tokenizer import make_dummy_model_dir  # noqa: E402
from bench.server_proc import free_port  # noqa: E402

CONFIGS: dict[str, tuple[list[str], tuple[str, ...], str]] = {
    "A": ([], ("long_short", "overlap", "throughput"), "defaults (chunk 8192 on CUDA, overlap on)"),
    "B": (["--chunked-prefill-size", "2048"], ("long_short",), "chunked prefill 2048"),
    "C": (["--chunked-prefill-size", "-1"], ("long_short",), "chunked prefill off"),
    "D": (["--disable-overlap-schedule"], ("overlap",), "overlap scheduling off"),
    "E": (["--chunked-prefill-size", "1024"], ("long_short",), "chunked prefill 1024"),
}
SMALL_FLAGS = {"B": (["--chunked-prefill-size", "128"], "chunked prefill 128 (CPU default: 512)")}
PHASE_ALIASES = {"a": "long_short", "b": "overlap", "c": "throughput"}
PHASE_TIMEOUT_S = {"warmup": 120, "long_short": 100, "overlap": 100, "throughput": 160}
SMALL_PHASE_TIMEOUT_S = {"warmup": 90, "long_short": 60, "overlap": 60, "throughput": 120}
PHASE_MIN_S = {"warmup": 10, "long_short": 35, "overlap": 20, "throughput": 60}  # skip below this
_PR_SET_PDEATHSIG = 1


# ----------------------------------------------------------------------------- server processes


try:  # loaded here, not in the forked child (dlopen there could deadlock behind another thread)
    _LIBC: Any = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:
    _LIBC = None


def _child_setup() -> None:  # runs in the server process before exec
    os.setpgid(0, 0)
    if _LIBC is not None:  # die with this script, even if it is SIGKILLed
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def live_group_pids(pgid: int) -> list[int] | None:
    """Processes of group `pgid` that are not zombies (orphans may wait long for a reaper), from
    /proc; None where /proc cannot be read."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    out = []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            stat = Path(f"/proc/{e}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(e))
    return out


class ServerProc:
    """`radixrt launch-server` in its own process group; stop() ends the whole group."""

    live: list[ServerProc] = []

    def __init__(self, flags: list[str], cwd: Path, log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path
        cmd = [sys.executable, "-m", "radixrt.cli", "launch-server", "--host", "127.0.0.1",
               "--port", str(self.port), *flags]
        self.cmd = cmd
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=_child_setup)
        ServerProc.live.append(self)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=10.0, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"server not healthy after {timeout_s:.0f} s")

    def _group_alive(self) -> bool:
        live = live_group_pids(self.proc.pid)
        if live is not None:
            return bool(live)
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def stop(self) -> None:
        """SIGTERM the group, wait (up to 30 s) until every process of it is gone, then SIGKILL."""
        for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                self.proc.poll()
                if not self._group_alive():
                    break
                time.sleep(0.2)
            if not self._group_alive():
                break
        self.proc.poll()
        if self in ServerProc.live:
            ServerProc.live.remove(self)


def _stop_all() -> None:
    for s in list(ServerProc.live):
        s.stop()


_PROBE = ("import importlib.util as u\ntry:\n    ok = all(u.find_spec(m) for m in "
          "('radixrt.cli', 'radixrt.kernels', 'radixrt.tokenizer_proc'))\n"
          "except ImportError:\n    ok = False\n"
          "raise SystemExit(0 if ok else 1)")


def server_cwd(tmp: Path, force_overlay: bool = False) -> Path:
    """Where to start the server: the repo root if radixrt (with its kernels and tokenizer_proc
    subpackages, mapped by pyproject.toml) imports from there; else a directory whose radixrt/ links
    the repo's radixrt/ entries plus kernels/, tokenizer_proc/ and bench/ (a plain, uninstalled tree)."""
    if not force_overlay and subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT).returncode == 0:
        return ROOT
    pkg = tmp / "overlay" / "radixrt"
    pkg.mkdir(parents=True, exist_ok=True)
    for entry in (ROOT / "radixrt").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for sub in ("kernels", "tokenizer_proc", "bench"):
        (pkg / sub).symlink_to(ROOT / sub)
    if subprocess.run([sys.executable, "-c", _PROBE], cwd=pkg.parent).returncode != 0:
        raise RuntimeError("cannot import radixrt (with radixrt.kernels and radixrt.tokenizer_proc)")
    return pkg.parent


# ----------------------------------------------------------------------------- running phases


def run_with_timeout(fn: Any, res: dict, timeout_s: float) -> str | None:
    """Run fn(res) in a thread; None if it finished, else the error text (traceback or timeout).
    `res` keeps whatever fn stored before failing or timing out."""
    err: list[str] = []

    def target() -> None:
        try:
            fn(res)
        except BaseException:  # noqa: BLE001 - reported in the JSON, the run goes on
            err.append(traceback.format_exc(limit=8))

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        return f"timeout: phase still running after {timeout_s:.0f} s (server killed)"
    return err[0] if err else None


def _snapshot(d: dict) -> dict:
    for _ in range(5):  # a timed-out phase thread may still be writing into it
        try:
            return copy.deepcopy(d)
        except RuntimeError:
            time.sleep(0.05)
    return {"error": "could not copy the phase results"}


def _gpu_name() -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--config-dir", default=None,
                   help="dir with config.json (default: bench/configs/qwen2.5-7b-instruct; "
                        "with --small the default model's)")
    p.add_argument("--configs", default="A,B,D,C",
                   help="server configs to run, in this order (C, the no-chunking baseline, last)")
    p.add_argument("--phases", default="long_short,overlap,throughput",
                   help="phases to run where a config has them (a,b,c also accepted)")
    p.add_argument("--small", action="store_true", help="tiny sizes, CPU (smoke test)")
    p.add_argument("--device", default=None, help="server --device (default: cuda; cpu with --small)")
    p.add_argument("--server-args", default="", help="extra flags for every server (one string)")
    p.add_argument("--budget-s", type=float, default=400.0,
                   help="whole-run budget: phases and configs that would not fit are skipped "
                        "(default 400: inside bench/h200_run.sh's 420 s serving stage)")
    p.add_argument("--start-timeout-s", type=float, default=None,
                   help="server start (default 300; 120 small)")
    p.add_argument("--force-overlay", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    ns.configs = [c.strip().upper() for c in ns.configs.split(",") if c.strip()]
    ns.phases = [PHASE_ALIASES.get(x.strip(), x.strip()) for x in ns.phases.split(",") if x.strip()]
    bad = [c for c in ns.configs if c not in CONFIGS] + [x for x in ns.phases if x not in PHASE_TIMEOUT_S]
    if bad:
        p.error(f"unknown config or phase: {', '.join(bad)}")
    ns.device = ns.device or ("cpu" if ns.small else "cuda")
    ns.start_timeout_s = ns.start_timeout_s or (120.0 if ns.small else 300.0)
    return ns


def _default_config_dir(small: bool) -> Path:
    if not small:
        return ROOT / "bench" / "configs" / "qwen2.5-7b-instruct"
    from radixrt.config import Env
    from radixrt.models.loader import resolve_model_dir

    return resolve_model_dir(None, Env.read().cache_dir, "auto")


class ServingRun:
    """One benchmark run: its report (saved after every phase, atomically), its budget, and the
    servers it starts one config at a time."""

    def __init__(self, ns: argparse.Namespace, argv: list[str] | None) -> None:
        self.ns, self.t_begin = ns, time.monotonic()
        self.out_dir = Path(ns.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="gpu_serving_"))
        self.model_dir = make_dummy_model_dir(ns.config_dir or _default_config_dir(ns.small),
                                              self.tmp / "model")
        self.sizes = gpu_phases.SMALL if ns.small else gpu_phases.FULL
        self.timeouts = SMALL_PHASE_TIMEOUT_S if ns.small else PHASE_TIMEOUT_S
        self.report: dict[str, Any] = {
            "schema_version": 1, "tool": "bench/gpu_serving.py",
            "argv": sys.argv[1:] if argv is None else argv,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "small": ns.small,
            "gpu": _gpu_name(), "git_commit": git_commit(), "config_dir": str(ns.config_dir or "default"),
            "sizes": gpu_phases.sizes_dict(self.sizes), "configs": {}, "summary": [],
        }
        self.json_path = self.out_dir / "serving.json"
        self.long_short_samples: dict[str, dict] = {}
        self.failed = False
        self.cwd = server_cwd(self.tmp, ns.force_overlay)
        self.report["server_cwd"] = "repo" if self.cwd == ROOT else "overlay"

    def save(self) -> None:
        tmp_json = self.json_path.with_suffix(".json.tmp")
        try:
            text = json.dumps(self.report, indent=1, default=str, allow_nan=False)
        except ValueError:  # a NaN somewhere: keep the data rather than nothing
            text = json.dumps(self.report, indent=1, default=str)
        tmp_json.write_text(text)
        tmp_json.replace(self.json_path)

    def remaining(self) -> float:
        return self.ns.budget_s - (time.monotonic() - self.t_begin)

    def log(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t_begin:6.1f}s] {msg}", flush=True)

    def run_config(self, name: str) -> None:
        """Start the server of config `name`, run its selected phases, stop it."""
        flags, phases, desc = CONFIGS[name]
        if self.ns.small and name in SMALL_FLAGS:  # the CPU default chunk is 512: B must be smaller
            flags, desc = SMALL_FLAGS[name]
        phases = [ph for ph in phases if ph in self.ns.phases]
        entry: dict[str, Any] = {"description": desc, "flags": flags, "phases": {}, "errors": []}
        self.report["configs"][name] = entry
        if not phases:
            entry["skipped"] = "no selected phase"
            return
        if self.remaining() < 60 + min(PHASE_MIN_S[ph] for ph in phases):
            entry["skipped"] = f"budget: {self.remaining():.0f} s left"
            self.save()
            return
        all_flags = ["--model-path", str(self.model_dir), "--load-format", "dummy", "--device",
                     self.ns.device,
                     "--max-running-requests", "256", *flags, *shlex.split(self.ns.server_args)]
        self.log(f"config {name} ({desc}): starting server")
        t0 = time.monotonic()
        server = ServerProc(all_flags, self.cwd, self.tmp / f"server-{name}.log")
        entry["server_cmd"] = shlex.join(server.cmd[2:])
        try:
            server.wait_healthy(min(self.ns.start_timeout_s, max(self.remaining() - 20, 10)))
            entry["server_start_s"] = time.monotonic() - t0
            info = httpx.get(server.url + "/get_server_info", timeout=30, trust_env=False).json()
            entry["worker"] = info.get("worker")
            entry["server_args"] = {k: info.get(k) for k in ("chunked_prefill_size",
                                                             "disable_overlap_schedule",
                                                             "max_running_requests", "context_length")}
            vocab = int((info.get("worker") or {}).get("vocab_size") or 32000)
            self.log(f"  healthy after {entry['server_start_s']:.1f} s")
            for ph in ["warmup", *phases]:
                if not self.run_phase(entry, f"{name}: {desc}", ph, phases, server, vocab):
                    break
        except Exception as e:  # noqa: BLE001 - the next config may still work
            entry["errors"].append(f"{type(e).__name__}: {e}")
            self.failed = True
        finally:
            if entry["errors"]:
                entry["server_log_tail"] = server.log_tail()
            server.stop()
            self.save()

    def run_phase(self, entry: dict[str, Any], label: str, ph: str, phases: list[str], server: ServerProc,
                  vocab: int) -> bool:
        """One phase against a running server, under its timeout; False when the config should stop."""
        left = self.remaining() - 10
        if ph != "warmup" and left < PHASE_MIN_S[ph]:
            entry["phases"][ph] = {"skipped": f"budget: {left:.0f} s left"}
            return True
        fn = gpu_phases.phase_fn(ph, server.url, self.sizes, vocab, self.out_dir,
                                 deadline_s=min(self.timeouts[ph], left) - 8,
                                 with_long="long_short" in phases)
        res: dict[str, Any] = {}
        t_ph = time.monotonic()
        err = run_with_timeout(fn, res, min(self.timeouts[ph], max(left, 5)))
        res = _snapshot(res)
        res["phase_s"] = time.monotonic() - t_ph
        if err:
            res["error"] = err
            entry["errors"].append(f"{ph}: {err.strip().splitlines()[-1]}")
            self.failed = True
        if ph == "long_short" and "samples" in res:
            self.long_short_samples[label] = res.pop("samples")
            res["plot"] = gpu_phases.plot_long_short(self.long_short_samples, self.out_dir)
        entry["phases"][ph] = res
        self.save()
        self.log(f"  {ph}: {res['phase_s']:.1f} s{' ERROR ' + entry['errors'][-1] if err else ''}")
        return not (err and (err.startswith("timeout") or server.proc.poll() is not None))

    def finish(self) -> None:
        _stop_all()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.report["summary"] = gpu_phases.summary_rows(self.report)
        self.report["wall_s"] = time.monotonic() - self.t_begin
        self.save()


def main(argv: list[str] | None = None) -> int:
    run = ServingRun(parse_args(argv), argv)

    def on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    atexit.register(_stop_all)
    run.save()
    try:
        for name in run.ns.configs:
            run.run_config(name)
    except BaseException as e:  # SIGTERM / Ctrl-C: record it; the finally below saves and cleans up
        run.report["interrupted"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        run.finish()
    print(gpu_phases.format_table(run.report), flush=True)
    print(f"wrote {run.json_path} ({run.report['wall_s']:.0f} s)", flush=True)
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
