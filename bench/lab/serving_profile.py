"""Where the HTTP serving path spends its time (issue 19 part 3): CPU time and py-spy samples of the
scheduler, tokenizer and worker processes and of this load generator while one workload runs.

    python3 bench/lab/serving_profile.py --out-dir $OUT/profile            # GPU: Qwen2.5-7B shape
    python3 bench/lab/serving_profile.py --small --out-dir /tmp/prof       # CPU smoke test

One `radixrt launch-server` with serving_goals.py's flags (dummy weights, --max-running-requests 256),
warmed up as there; then per workload (--workloads, serving_goals.py's sizes): the run's wall time,
output tok/s, and for each process its CPU seconds over the run (/proc/PID/stat utime + stime; this
process: os.times) and, when py-spy is on PATH, `py-spy record --nonblocking -r 100 -f raw` into
OUT_DIR/WORKLOAD-PROC.txt (collapsed stacks; idle frames excluded, so samples / (100 x (wall + 1 s))
is the share of the recording, which starts 1 s before the load, that the process spent running
Python or native code). Prints each process's busy share
and its top self frames; writes OUT_DIR/profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

RATE_HZ = 100
ROLES = ("scheduler", "tokenizer", "worker")


def child_pids(root_pid: int) -> dict[str, int]:
    """The server's processes by role (`python -m radixrt.child ROLE`), found under /proc."""
    out: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "radixrt.child" in args:
            i = args.index("radixrt.child") + 1
            role = args[i] if i < len(args) else ""
            if role in ROLES:
                out[role] = int(entry)
    return out


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process in seconds, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def top_frames(raw: Path, n: int = 12) -> tuple[int, list[tuple[str, int]]]:
    """Samples in a py-spy raw file and its n most frequent innermost frames."""
    leaf: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        leaf[stack.split(";")[-1]] += int(count)
    return total, leaf.most_common(n)


def profile_run(url: str, spec: Any, pids: dict[str, int], out_dir: Path) -> dict[str, Any]:
    """Run one workload (serving_goals._bench) with py-spy on every process; the summary dict."""
    from bench.serving_goals import _bench, _pick

    spy = shutil.which("py-spy")
    procs = {**pids, "loadgen": os.getpid()}
    recorders: dict[str, tuple[subprocess.Popen, Path]] = {}
    if spy:
        for name, pid in procs.items():
            path = out_dir / f"{spec.name}-{name}.txt"
            cmd = [spy, "record", "--nonblocking", "-r", str(RATE_HZ), "-f", "raw", "-o", str(path),
                   "-p", str(pid), "-d", "600"]
            recorders[name] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), path)
        time.sleep(1.0)  # let py-spy attach before the load starts
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    own0 = os.times()
    t0 = time.monotonic()
    run = _pick(_bench(url, spec))
    wall = time.monotonic() - t0
    own1 = os.times()
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    res: dict[str, Any] = {"wall_s": wall, **run, "processes": {}}
    cpu = {name: None if before[name] is None or after[name] is None else after[name] - before[name]
           for name in pids}
    cpu["loadgen"] = (own1.user + own1.system) - (own0.user + own0.system)
    for name, (proc, path) in recorders.items():
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        entry: dict[str, Any] = {"cpu_s": cpu.get(name), "cpu_share": (cpu.get(name) or 0) / wall}
        if path.exists():
            samples, frames = top_frames(path)
            entry.update(samples=samples, busy_share=samples / (RATE_HZ * (wall + 1.0)), top=frames)
        else:
            entry["py_spy_error"] = err.decode(errors="replace")[-500:]
        res["processes"][name] = entry
    for name in procs:
        res["processes"].setdefault(name, {"cpu_s": cpu.get(name), "cpu_share": (cpu.get(name) or 0) / wall})
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", required=True)
    p.add_argument("--small", action="store_true", help="CPU sizes and the default model's shape")
    p.add_argument("--workloads", default="shared-prefix,multi-turn,random")
    p.add_argument("--device", default=None, help="default: cuda unless --small")
    ns = p.parse_args(argv)
    import httpx

    from bench import gpu_phases
    from bench.dummy_tokenizer import make_dummy_model_dir
    from bench.gpu_serving import ServerProc, _default_config_dir, server_cwd
    from bench.serving_goals import _bench, _warm_spec, workloads

    out_dir = Path(ns.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = ns.device or ("cpu" if ns.small else "cuda")
    tmp = Path(tempfile.mkdtemp(prefix="serving_profile_"))
    model_dir = make_dummy_model_dir(_default_config_dir(ns.small), tmp / "model")
    flags = ["--model-path", str(model_dir), "--load-format", "dummy", "--device", device,
             "--max-running-requests", "256"]
    server = ServerProc(flags, server_cwd(tmp), tmp / "server.log")
    report: dict[str, Any] = {"tool": "bench/lab/serving_profile.py", "device": device,
                              "py_spy": shutil.which("py-spy"), "runs": {}}
    try:
        server.wait_healthy(120 if ns.small else 300)
        info = httpx.get(server.url + "/get_server_info", timeout=30, trust_env=False).json()
        vocab = int(info["worker"]["vocab_size"])
        sizes = gpu_phases.SMALL if ns.small else gpu_phases.FULL
        gpu_phases.warmup(server.url, sizes, vocab, True, {})
        pids = child_pids(server.proc.pid)
        report["pids"] = pids
        wanted = ns.workloads.split(",")
        for spec in workloads(ns.small, vocab):
            if spec.name not in wanted:
                continue
            _bench(server.url, _warm_spec(spec))
            r = report["runs"][spec.name] = profile_run(server.url, spec, pids, out_dir)
            print(f"== {spec.name}: {r['output_throughput']:.0f} out tok/s in {r['wall_s']:.1f} s",
                  flush=True)
            for name, e in r["processes"].items():
                busy = f", py-spy busy {e['busy_share']:.2f}" if "busy_share" in e else ""
                print(f"  {name:9s} cpu {e['cpu_share']:.2f} cores{busy}", flush=True)
                for frame, n in e.get("top", [])[:8]:
                    print(f"      {n / max(1, e['samples']) * 100:5.1f}%  {frame[:120]}", flush=True)
            (out_dir / "profile.json").write_text(json.dumps(report, indent=1, default=str))
    finally:
        server.stop()
    (out_dir / "profile.json").write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
