"""Pass-by-pass timelines of the Engine and the HTTP server on the same workloads (issue 19 part 3).

    python3 bench/lab/pass_timeline.py --out-dir $OUT/timeline          # H200, Qwen2.5-7B shape, ~150 s
    python3 bench/lab/pass_timeline.py --small --out-dir /tmp/tl        # CPU smoke test
    python3 bench/lab/pass_timeline.py --summarize-only --out-dir DIR   # tables of an earlier run

Runs bench/serving_goals.py with --throughput-only and --trace-dir (RADIXRT_PASS_TRACE in the Engine
child and in the server's scheduler, radixrt/scheduler/pass_trace.py), then cuts each trace into the
workloads' time windows (recorded by serving_goals.py in perf_counter seconds, a clock shared by the
processes of one machine) and prints, per workload and path:

    passes, wall (window) s, first pass after the window opened (ms), device busy share of the span
    from the first pass to the last, mean new tokens per pass, mean rows of the decode-only passes,
    extend passes and their mean tokens, the time until the running set first reached its peak
    (ramp) and from its last pass at that peak to the last pass (drain), the host time per pass
    (schedule + build + launch + process), and the device idle
    between passes (sum of gap_ms);

and the first passes (--head-ms of the span) of both paths side by side: offset ms, extend requests /
tokens, decode rows, device ms, and the waiting / running counts when each result came back. On
the CPU the Engine's launch computes the pass, so its "host ms per pass" includes the forward.
Writes OUT_DIR/timeline.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

WORKLOADS = ("random", "shared-prefix", "multi-turn")


def load(path: Path) -> list[dict[str, Any]]:
    """The records of a RADIXRT_PASS_TRACE file, in pass order ([] when it is missing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def in_window(records: list[dict[str, Any]], window: list[float]) -> list[dict[str, Any]]:
    t0, t1 = window
    return [r for r in records if t0 <= r["t_s"] <= t1]


def summarize(records: list[dict[str, Any]], window: list[float]) -> dict[str, Any]:
    """The per-path figures of the module docstring for the passes inside `window` ([t0, t1] s)."""
    recs = in_window(records, window)
    out: dict[str, Any] = {"passes": len(recs), "window_s": window[1] - window[0]}
    if not recs:
        return out
    first, last = recs[0], recs[-1]
    span_ms = (last["t_s"] - first["t_s"]) * 1e3 + last["launch_ms"] + last["wait_ms"]
    decode_only = [r["decode_reqs"] for r in recs if r["extend_reqs"] == 0]
    extends = [r["extend_tokens"] for r in recs if r["extend_reqs"] > 0]
    peak = max(r["running"] for r in recs)
    ramp = next(r for r in recs if r["running"] == peak)
    last_peak = next(r for r in reversed(recs) if r["running"] == peak)
    out.update({
        "first_pass_ms": (first["t_s"] - window[0]) * 1e3,
        "span_ms": span_ms,
        "busy_share": sum(r["busy_ms"] for r in recs) / span_ms if span_ms > 0 else None,
        "mean_tokens": statistics.fmean(r["tokens"] for r in recs),
        "mean_decode_rows": statistics.fmean(decode_only) if decode_only else 0.0,
        "decode_passes": len(decode_only),
        "extend_passes": len(extends),
        "mean_extend_tokens": statistics.fmean(extends) if extends else 0.0,
        "peak_running": peak,
        "ramp_ms": (ramp["t_s"] - first["t_s"]) * 1e3,
        "drain_ms": (last["t_s"] - last_peak["t_s"]) * 1e3,
        "host_ms_per_pass": statistics.fmean(
            r["schedule_ms"] + r["build_ms"] + r["launch_ms"] + r["process_ms"] for r in recs),
        "gap_ms_total": sum(r["gap_ms"] for r in recs if r["gap_ms"] > 0),
    })
    return out


def head(records: list[dict[str, Any]], window: list[float], head_ms: float) -> list[dict[str, Any]]:
    """The passes of the first head_ms after the window's first pass, with their offset (ms)."""
    recs = in_window(records, window)
    if not recs:
        return []
    t0 = recs[0]["t_s"]
    return [{**r, "offset_ms": (r["t_s"] - t0) * 1e3} for r in recs if (r["t_s"] - t0) * 1e3 <= head_ms]


SUMMARY_ROWS = [  # (label, key, format)
    ("passes", "passes", "{:d}"),
    ("first pass after the window opened (ms)", "first_pass_ms", "{:.1f}"),
    ("span first -> last pass (ms)", "span_ms", "{:.1f}"),
    ("device busy share of the span", "busy_share", "{:.2f}"),
    ("mean new tokens per pass", "mean_tokens", "{:.1f}"),
    ("decode-only passes", "decode_passes", "{:d}"),
    ("mean rows of a decode-only pass", "mean_decode_rows", "{:.1f}"),
    ("extend passes", "extend_passes", "{:d}"),
    ("mean tokens of an extend pass", "mean_extend_tokens", "{:.0f}"),
    ("peak running", "peak_running", "{:d}"),
    ("ramp: first pass -> peak running (ms)", "ramp_ms", "{:.1f}"),
    ("drain: last pass at peak running -> last pass (ms)", "drain_ms", "{:.1f}"),
    ("host ms per pass (schedule+build+launch+process)", "host_ms_per_pass", "{:.2f}"),
    ("device idle between passes, total (ms)", "gap_ms_total", "{:.1f}"),
]


def _cell(r: dict[str, Any]) -> str:
    return (f"{r['offset_ms']:.1f}: {r['extend_reqs']} / {r['extend_tokens']}, {r['decode_reqs']}, "
            f"{r['busy_ms']:.1f} (w {r['waiting']}, r {r['running']})")


def _fmt(fmt: str, v: Any) -> str:
    return "-" if v is None else fmt.format(v)


def tables(report: dict[str, Any], trace_dir: Path, head_ms: float) -> tuple[str, dict[str, Any]]:
    """Markdown tables for every workload present in both parts of the serving_goals report."""
    traces = {"engine": load(trace_dir / "engine.jsonl"), "http": load(trace_dir / "server.jsonl")}
    lines: list[str] = []
    data: dict[str, Any] = {}
    for wl in WORKLOADS:
        parts = {p: (report.get(p) or {}).get(wl) or {} for p in ("engine", "http")}
        if not all("window" in parts[p] for p in parts):
            continue
        sums = {p: summarize(traces[p], parts[p]["window"]) for p in parts}
        heads = {p: head(traces[p], parts[p]["window"], head_ms) for p in parts}
        tput = {p: parts[p].get("output_throughput") for p in parts}
        data[wl] = {"summary": sums, "head": heads, "output_throughput": tput}
        ratio = tput["http"] / tput["engine"] if tput["engine"] and tput["http"] else None
        lines += [f"### {wl}: HTTP / Engine output tok/s {_fmt('{:.0f}', tput['http'])} / "
                  f"{_fmt('{:.0f}', tput['engine'])} = {_fmt('{:.2f}', ratio)}", "",
                  "| | Engine | HTTP |", "|---|---|---|"]
        for label, key, fmt in SUMMARY_ROWS:
            e, h = (_fmt(fmt, sums[p].get(key)) for p in ("engine", "http"))
            lines.append(f"| {label} | {e} | {h} |")
        lines += ["", f"First {head_ms:.0f} ms (offset ms: extend reqs / tokens, decode rows, device ms "
                      "(waiting, running when the result came)):", "",
                  "| # | Engine | HTTP |", "|---|---|---|"]
        for i in range(max(len(heads["engine"]), len(heads["http"]))):
            cells = []
            for p in ("engine", "http"):
                r = heads[p][i] if i < len(heads[p]) else None
                cells.append("" if r is None else _cell(r))
            lines.append(f"| {i} | {cells[0]} | {cells[1]} |")
        lines.append("")
    return "\n".join(lines), data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--small", action="store_true", help="CPU sizes (smoke test)")
    p.add_argument("--head-ms", type=float, default=200.0)
    p.add_argument("--summarize-only", action="store_true", help="read OUT_DIR of an earlier run")
    p.add_argument("--transport", choices=["raw", "httpx"], default="raw", help="the load generator's client")
    p.add_argument("--connections", choices=["keep-alive", "close"], default="keep-alive",
                   help="the load generator's connections")
    ns = p.parse_args(argv)
    out = Path(ns.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report_path = out / "serving-goals.json"
    rc = 0
    if not ns.summarize_only:
        from bench import serving_goals

        rc = serving_goals.main(["--out", str(report_path), "--throughput-only", "--trace-dir", str(out),
                                 "--transport", ns.transport, "--connections", ns.connections,
                                 *(["--small"] if ns.small else [])])
    report = json.loads(report_path.read_text())
    text, data = tables(report, out, ns.head_ms)
    (out / "timeline.json").write_text(json.dumps(data, indent=1))
    print(text, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
