"""PNG plots of serving benchmark results (matplotlib, Agg backend: no display needed).

- plot_latency_cdfs: empirical CDFs of TTFT, ITL and e2e latency (ms), one line per run.
- plot_concurrency_sweep: output tok/s and median TTFT / TPOT (ms) against max concurrency.
- plot_long_short: short-request TTFT over time and stream ITL CDFs, one series per server config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402


def _cdf(ax: Any, values_ms: list[float], label: str) -> None:
    if not values_ms:
        return
    x = np.sort(np.asarray(values_ms, dtype=np.float64))
    y = np.arange(1, x.size + 1) / x.size
    ax.step(x, y, where="post", label=label)


def plot_latency_cdfs(samples: dict[str, list[Any]], path: Path) -> Path:
    """Three panels (TTFT, ITL, e2e) of latency CDFs; `samples` maps a run label to its RequestOutcomes
    (objects with ok, ttft_s, itl_s, e2e_s in seconds). Returns the PNG path (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for label, outcomes in samples.items():
        ok = [o for o in outcomes if o.ok]
        _cdf(axes[0], [o.ttft_s * 1e3 for o in ok if o.ttft_s is not None], label)
        _cdf(axes[1], [g * 1e3 for o in ok for g in o.itl_s], label)
        _cdf(axes[2], [o.e2e_s * 1e3 for o in ok], label)
    for ax, title in zip(axes, ("TTFT", "ITL", "end-to-end latency"), strict=True):
        ax.set_title(title)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of samples")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_concurrency_sweep(runs: list[dict], path: Path) -> Path:
    """Output tok/s (left) and median TTFT / TPOT in ms (right) against max concurrency (log2 x axis);
    `runs` are run dicts of bench/serving.py. Returns the PNG path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    points = sorted((r["max_concurrency"], r) for r in runs if r["max_concurrency"])
    conc = [c for c, _ in points]
    fig, (ax_tp, ax_lat) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax_tp.plot(conc, [r["output_throughput"] for _, r in points], marker="o")
    ax_tp.set_ylabel("output tok/s")
    ax_tp.set_title("throughput vs concurrency")
    for key, label in (("ttft_ms", "median TTFT"), ("tpot_ms", "median TPOT")):
        ax_lat.plot(conc, [r[key]["median"] if r[key]["median"] is not None else np.nan for _, r in points],
                    marker="o", label=label)
    ax_lat.set_ylabel("ms")
    ax_lat.set_title("latency vs concurrency")
    ax_lat.legend(fontsize=8)
    for ax in (ax_tp, ax_lat):
        ax.set_xscale("log", base=2)
        ax.set_xticks(conc, [str(c) for c in conc])
        ax.minorticks_off()
        ax.set_xlabel("max concurrency")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_long_short(samples: dict[str, dict], path: Path) -> Path:
    """The long/short scenario (bench/long_short.py), one series per server configuration:
    short-request TTFT against send time (long prompts' arrivals as dotted lines, same colour) and
    the CDF of the streams' inter-token gaps. `samples` maps a label to the `samples` dict of
    run_long_short (short_send_s, short_ttft_ms, long_send_s, itl_ms). Returns the PNG path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(13, 4.5))
    for i, (label, s) in enumerate(samples.items()):
        color = f"C{i % 10}"
        ax_t.plot(s.get("short_send_s", []), s.get("short_ttft_ms", []), "o", ms=3.5, color=color,
                  label=label)
        for t in s.get("long_send_s", []):
            ax_t.axvline(t, color=color, ls=":", lw=1)
        _cdf(ax_c, list(s.get("itl_ms", [])), label)
    ax_t.set_title("short requests: TTFT vs send time (dotted: long prompts sent)")
    ax_t.set_xlabel("s since window start")
    ax_t.set_ylabel("TTFT (ms)")
    ax_t.set_yscale("log")
    ax_c.set_title("decoding streams: inter-token gaps")
    ax_c.set_xlabel("ms")
    ax_c.set_xscale("log")
    ax_c.set_ylabel("fraction of gaps")
    ax_c.set_ylim(0, 1.02)
    for ax in (ax_t, ax_c):
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
