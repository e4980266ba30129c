"""Utilities shared by the benchmark scripts: device timing, the ceilings, the run header, output.

Every benchmark records where its numbers come from (`run_header`: UTC date, git commit, device,
torch and triton versions) and writes its JSON where `out_path` says (the --out flag, else $OUT/NAME
on a device call, else nowhere). Timing helpers return milliseconds of device time (medians).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def median(xs: list[float]) -> float | None:
    """The upper median of xs (the middle run of an odd count), None for no values."""
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def git_commit() -> str:
    """$COMMIT when set (device calls: the copied tree's own .git, where there is one, can be a stale
    one; on 2026-12-05 it named 5c48a56 for the tree of 3549af9), else the checkout's short commit."""
    if os.environ.get("COMMIT"):
        return os.environ["COMMIT"]
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                           timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def run_header(device: str = "cuda") -> dict[str, Any]:
    """Date (UTC), commit, device name and library versions of this run, for the results tables."""
    import torch

    now = datetime.datetime.now(datetime.timezone.utc)
    header: dict[str, Any] = {"date": now.strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
                              "torch": torch.__version__}
    if device.startswith("cuda") and torch.cuda.is_available():
        import triton

        props = torch.cuda.get_device_properties(0)
        header.update(device=props.name, num_sms=props.multi_processor_count, triton=triton.__version__)
    else:
        header["device"] = "cpu"
    return header


def out_path(arg: str | None, name: str) -> Path | None:
    """Where a benchmark writes its JSON: --out if given, else $OUT/name on a device call, else None."""
    if arg:
        return Path(arg)
    return Path(os.environ["OUT"]) / name if os.environ.get("OUT") else None


def write_json(path: Path | str | None, obj: Any) -> None:
    """Write obj as indented JSON (no-op for path None); values JSON cannot hold are written as str."""
    if path is not None:
        Path(path).write_text(json.dumps(obj, indent=1, default=str))


def cuda_ms(fn: Callable[[], Any], warmup: int = 25, rep: int = 100) -> float:
    """Median device time of fn() in ms (triton.testing.do_bench: CUDA events, L2 flushed per call)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def graph_ms(run: Callable[[], Any], reps: int = 1, timer: Callable[..., float] = cuda_ms) -> float:
    """Median time of one run() replayed from a CUDA graph of `reps` back-to-back calls (no Python
    launch cost, as the server replays decode). run() must have been called once eagerly."""
    import torch

    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            run()
    return timer(graph.replay) / reps


def rel_err(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in fp32 (NaN if out holds any NaN: an unwritten output)."""
    import torch

    if torch.isnan(out).any():
        return float("nan")
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def measure_ceilings(copy_gib: float = 2, warmup: int = 25, rep: int = 100) -> dict[str, float]:
    """The device's copy bandwidth (bytes read + written per s, a copy of `copy_gib` GiB of bf16) and
    bf16 matmul rate (8192^3), as medians of CUDA-event timings; the buffers are freed before return."""
    import torch

    n = int(copy_gib * (1 << 30)) // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = cuda_ms(lambda: dst.copy_(src), warmup, rep)
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    mm_ms = cuda_ms(lambda: a @ b, warmup, rep)
    src = dst = a = b = None  # freed before the caller sizes its KV pool
    torch.cuda.empty_cache()
    return {"copy_bytes_per_s": 2 * n * 2 / (copy_ms * 1e-3), "copy_ms": copy_ms,
            "matmul_flops_per_s": 2 * m**3 / (mm_ms * 1e-3), "matmul_ms": mm_ms}
