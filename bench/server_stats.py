"""Scheduler figures from a radixrt server's GET /get_server_info, for benchmarks.

- `scheduler_info(base_url)`: the "scheduler" dict (None if the server does not answer).
- `scheduler_delta(before, after)`: what happened between two snapshots: passes, per-pass means of
  the scheduler timings over just those passes, GPU busy / gap time and the idle fraction
  d_gap / (d_gap + d_busy) (None where the server lacks `gpu_busy_ms_total` / `gpu_gap_ms_total`).
- `KVWastePoller`: a thread polling `running_kv_slots_unused` / `running_kv_slots_allocated`;
  `kv_waste_summary(samples)` gives the time-averaged and the aggregate unused fraction.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

MEAN_KEYS = ("forward_ms_mean", "result_wait_ms_mean", "schedule_ms_mean")
KV_WASTE_GOAL = 0.04


def scheduler_info(base_url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    try:
        r = httpx.get(base_url + "/get_server_info", timeout=timeout_s, trust_env=False)
        r.raise_for_status()
        return r.json().get("scheduler")
    except (httpx.HTTPError, ValueError):
        return None


def _num(d: dict | None, key: str) -> float | None:
    v = (d or {}).get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _diff(before: dict | None, after: dict | None, key: str) -> float | None:
    a, b = _num(after, key), _num(before, key)
    return None if a is None or b is None else a - b


def scheduler_delta(before: dict | None, after: dict | None) -> dict[str, Any]:
    """Per-phase scheduler figures between two `scheduler_info` snapshots (None where unknown)."""
    steps = _diff(before, after, "num_steps")
    out: dict[str, Any] = {"num_steps": None if steps is None else int(steps)}
    for key in MEAN_KEYS:  # the server reports lifetime means; undo the averaging over the earlier steps
        m0, m1 = _num(before, key), _num(after, key)
        n0, n1 = _num(before, "num_steps"), _num(after, "num_steps")
        ok = None not in (m0, m1, n0, n1) and steps
        out[key] = (m1 * n1 - m0 * n0) / steps if ok else None
    busy, gap = _diff(before, after, "gpu_busy_ms_total"), _diff(before, after, "gpu_gap_ms_total")
    out["gpu_busy_ms"], out["gpu_gap_ms"] = busy, gap
    known = busy is not None and gap is not None and gap + busy > 0
    out["gpu_idle_fraction"] = gap / (gap + busy) if known else None
    for key in ("num_generated_tokens", "num_finished_reqs", "num_retractions"):
        d = _diff(before, after, key)
        out[key] = None if d is None else int(d)
    queried, matched = _diff(before, after, "total_queried_tokens"), _diff(before, after,
                                                                           "total_matched_tokens")
    out["cache_hit_rate"] = matched / queried if queried and matched is not None else None
    return out


def kv_waste_summary(samples: list[dict]) -> dict[str, Any]:
    """Unused fraction of the KV slots held by running requests, over polls where any were held.

    time_avg: mean of the per-poll ratios (polls are evenly spaced); aggregate: sum unused / sum allocated.
    """
    held = [s for s in samples if (s.get("allocated") or 0) > 0]
    ratios = [s["unused"] / s["allocated"] for s in held]
    alloc = sum(s["allocated"] for s in held)
    agg = sum(s["unused"] for s in held) / alloc if alloc else None
    avg = sum(ratios) / len(ratios) if ratios else None
    return {"polls": len(samples), "polls_with_running": len(held), "time_avg_unused_fraction": avg,
            "aggregate_unused_fraction": agg, "max_unused_fraction": max(ratios) if ratios else None,
            "mean_slots_allocated": alloc / len(held) if held else None, "goal": KV_WASTE_GOAL,
            "meets_goal": None if agg is None else bool(agg < KV_WASTE_GOAL and avg < KV_WASTE_GOAL)}


class KVWastePoller:
    """Poll /get_server_info every `interval_s` in a thread; `stop()` returns the samples."""

    def __init__(self, base_url: str, interval_s: float = 0.5) -> None:
        self.base_url, self.interval_s = base_url, interval_s
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="kv-waste-poller")

    def start(self) -> KVWastePoller:
        self._thread.start()
        return self

    def _loop(self) -> None:
        t0 = time.perf_counter()
        with httpx.Client(base_url=self.base_url, timeout=5.0, trust_env=False) as client:
            while not self._stop.is_set():
                try:
                    s = client.get("/get_server_info").json().get("scheduler") or {}
                    if "running_kv_slots_allocated" in s:
                        self.samples.append({"t": round(time.perf_counter() - t0, 3),
                                             "allocated": s["running_kv_slots_allocated"],
                                             "unused": s.get("running_kv_slots_unused", 0),
                                             "running": s.get("num_running_reqs"),
                                             "waiting": s.get("num_waiting_reqs")})
                except (httpx.HTTPError, ValueError):
                    pass
                self._stop.wait(self.interval_s)

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples


def wait_idle(base_url: str, timeout_s: float = 30.0) -> float | None:
    """Seconds until the server has no running or waiting request (None if it did not get there)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        s = scheduler_info(base_url, timeout_s=5.0)
        if s is not None and not s.get("num_running_reqs") and not s.get("num_waiting_reqs"):
            return time.perf_counter() - t0
        time.sleep(0.2)
    return None
