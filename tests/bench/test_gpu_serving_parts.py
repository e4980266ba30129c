"""The pure-Python parts of bench/gpu_serving.py: long/short summaries from synthetic timings, the
scenario against the fake server, scheduler deltas, KV waste, the phase timeout, the final table."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from bench import gpu_phases, gpu_serving
from bench.long_short import (
    LongShortParams,
    run_long_short,
    short_offsets,
    summarize_long_short,
    window_gaps_s,
)
from bench.plots import plot_long_short
from bench.server_stats import kv_waste_summary, scheduler_delta
from bench.serving import BenchConfig, run_benchmark
from bench.serving_metrics import RequestOutcome
from bench.workloads import WorkloadSpec
from tests.bench.fake_server import FakeOptions, fake_server


def _done(sid: int, start: float, ttft: float, e2e: float, prompt_len: int = 8) -> RequestOutcome:
    o = RequestOutcome(sid, 0, prompt_len, 4, start_s=start, ttft_s=ttft, e2e_s=e2e, stream_tokens=4)
    o.usage_completion_tokens = 4
    return o


def test_window_gaps_only_count_chunks_inside_the_window() -> None:
    assert window_gaps_s([0.5, 1.0, 1.25, 2.0, 3.5], 1.0, 3.0) == [0.25, 0.75]
    assert window_gaps_s([], 0, 1) == [] and window_gaps_s([2.0], 0, 5) == []


def test_short_offsets_are_poisson_within_the_duration() -> None:
    offs = short_offsets(4.0, 100.0, np.random.default_rng(0))
    assert all(0 < a < b < 100 for a, b in zip(offs, offs[1:], strict=False))
    assert 320 < len(offs) < 480  # ~400 expected


def test_summary_from_synthetic_timings() -> None:
    t0, t1 = 10.0, 20.0
    streams = []
    for i in range(2):  # a chunk every 10 ms, one 500 ms stall at t=15
        times = [9.0 + 0.01 * k for k in range(600)] + [15.49 + 0.01 * k for k in range(600)]
        streams.append(RequestOutcome(i, 0, 256, 6000, start_s=8.0, ttft_s=1.0, chunk_times_s=times))
    early = RequestOutcome(2, 0, 256, 6000, start_s=8.0, ttft_s=1.0, e2e_s=3.0, chunk_times_s=[9.0, 11.0])
    shorts = [_done(10 + k, t0 + k, 0.05 + 0.01 * k, 0.3) for k in range(10)]
    shorts.append(RequestOutcome(99, 0, 8, 4, start_s=t0 + 5, error="HTTP 500: boom"))
    longs = [_done(50, t0 + 1, 2.5, 2.6, prompt_len=32000)]
    s = summarize_long_short([*streams, early], longs, shorts, t0, t1)
    assert s["window_s"] == 10.0 and not s["timed_out"]
    assert s["short"]["sent"] == 11 and s["short"]["completed"] == 10 and s["short"]["failed"] == 1
    assert s["short"]["ttft_ms"]["median"] == pytest.approx(95.0)
    assert s["short"]["ttft_ms"]["max"] == pytest.approx(140.0)
    assert s["short"]["samples"][0] == [0.0, 50.0]
    assert s["errors"] == ["HTTP 500: boom"] and s["meets_goal"] is False  # a failed short fails the goal
    st = s["streams"]
    assert st["count"] == 3 and st["ended_early"] == 1 and st["itl_ms"]["max"] == pytest.approx(500, abs=1)
    assert st["itl_ms"]["median"] == pytest.approx(10.0, abs=0.1)
    assert s["long"]["ttft_ms"] == [2500.0] and s["long"]["prompt_len"] == [32000]
    json.dumps(s, allow_nan=False)


def test_scenario_against_the_fake_server() -> None:
    opts = FakeOptions(delay_s=0.005)
    p = LongShortParams(num_streams=3, stream_input_len=16, stream_max_tokens=5000, num_long=2,
                        long_input_len=200,
                        long_first_s=0.1, long_interval_s=0.2, short_rate=10.0, short_input_len=8,
                        short_output_len=3,
                        duration_s=0.6, vocab_size=5000)
    with fake_server(opts) as url:
        summary, samples = run_long_short(url, p, deadline_s=20)
    assert summary["long"]["completed"] == 2 and summary["short"]["failed"] == 0
    assert summary["short"]["completed"] == summary["short"]["sent"] == len(samples["short_ttft_ms"]) > 0
    assert summary["streams"]["ended_early"] == 0 and summary["streams"]["itl_ms"]["count"] > 50
    # the long prompts go out on their schedule (0.1 s, then 0.2 s later), never early; how late a
    # loaded machine lets them go is not this test's business (a generous bound only)
    first, second = summary["long"]["send_offset_s"]
    assert summary["window_s"] >= 0.6 and 0.095 <= first < 1.0 and 0.195 <= second - first < 1.0
    assert sorted(len(q) for q in opts.prompts).count(200) == 2


def test_scheduler_delta_undoes_lifetime_means_and_handles_missing_fields() -> None:
    before = {"num_steps": 100, "forward_ms_mean": 5.0, "schedule_ms_mean": 1.0, "result_wait_ms_mean": 4.0,
              "gpu_busy_ms_total": 500.0, "gpu_gap_ms_total": 50.0, "num_generated_tokens": 10,
              "total_queried_tokens": 100, "total_matched_tokens": 0}
    after = {"num_steps": 300, "forward_ms_mean": 4.0, "schedule_ms_mean": 0.5, "result_wait_ms_mean": 4.0,
             "gpu_busy_ms_total": 1300.0, "gpu_gap_ms_total": 250.0, "num_generated_tokens": 210,
             "total_queried_tokens": 300, "total_matched_tokens": 150}
    d = scheduler_delta(before, after)
    assert d["num_steps"] == 200 and d["forward_ms_mean"] == pytest.approx(3.5)
    assert d["schedule_ms_mean"] == pytest.approx(0.25) and d["result_wait_ms_mean"] == pytest.approx(4.0)
    assert d["gpu_busy_ms"] == 800 and d["gpu_gap_ms"] == 200 and d["gpu_idle_fraction"] == pytest.approx(0.2)
    assert d["num_generated_tokens"] == 200 and d["cache_hit_rate"] == pytest.approx(0.75)
    for k in ("gpu_busy_ms_total", "gpu_gap_ms_total"):
        before.pop(k), after.pop(k)
    d = scheduler_delta(before, after)
    assert d["gpu_idle_fraction"] is None and d["gpu_busy_ms"] is None and d["forward_ms_mean"] is not None
    assert scheduler_delta(None, None)["num_steps"] is None


def test_kv_waste_time_average_and_aggregate() -> None:
    samples = [{"allocated": 0, "unused": 0}, {"allocated": 100, "unused": 10},
               {"allocated": 300, "unused": 0}]
    w = kv_waste_summary(samples)
    assert w["polls"] == 3 and w["polls_with_running"] == 2
    assert w["time_avg_unused_fraction"] == pytest.approx(0.05)
    assert w["aggregate_unused_fraction"] == pytest.approx(0.025)
    assert w["meets_goal"] is False and w["max_unused_fraction"] == pytest.approx(0.1)
    assert kv_waste_summary([])["meets_goal"] is None


def test_run_with_timeout_keeps_partial_results() -> None:
    def slow(res: dict) -> None:
        res["first"] = 1
        time.sleep(5)

    res: dict = {}
    err = gpu_serving.run_with_timeout(slow, res, 0.3)
    assert err.startswith("timeout") and res == {"first": 1}
    err = gpu_serving.run_with_timeout(lambda r: 1 / 0, {}, 5)
    assert "ZeroDivisionError" in err
    assert gpu_serving.run_with_timeout(lambda r: r.update(x=1), {}, 5) is None


def test_args_phase_aliases_and_validation() -> None:
    ns = gpu_serving.parse_args(["--out-dir", "x", "--configs", "a,d", "--phases", "a,b"])
    assert ns.configs == ["A", "D"] and ns.phases == ["long_short", "overlap"] and ns.device == "cuda"
    assert gpu_serving.parse_args(["--out-dir", "x", "--small"]).device == "cpu"
    with pytest.raises(SystemExit):
        gpu_serving.parse_args(["--out-dir", "x", "--configs", "Z"])


def test_sweep_num_prompts_sets_each_level_size() -> None:
    spec = WorkloadSpec(name="random", num_prompts=99, input_len=8, output_len=3, vocab_size=5000, seed=1)
    with fake_server(FakeOptions()) as url:
        rep = run_benchmark(BenchConfig(base_url=url, workload=spec, concurrency_sweep=[1, 4],
                                        sweep_num_prompts=[2, 6], disable_tqdm=True))
    assert [r["num_requests"] for r in rep["runs"]] == [2, 6] and all(r["failed"] == 0 for r in rep["runs"])
    with pytest.raises(ValueError):
        BenchConfig(concurrency_sweep=[1, 2], sweep_num_prompts=[3])


def test_summary_table_and_long_short_plot(tmp_path: Path) -> None:
    ttft = {"mean": 1.0, "median": 1.0, "p90": 2.0, "p99": 3.0, "min": 1.0, "max": 3.0, "count": 3}
    run = {k: None for k in gpu_phases.RUN_KEYS} | {"max_concurrency": 4, "output_throughput": 100.0,
                                                    "failed": 0,
                                                    "ttft_ms": ttft, "tpot_ms": ttft, "itl_ms": ttft}
    report = {"gpu": "H200", "small": False, "configs": {
        "A": {"description": "defaults", "flags": [], "server_start_s": 40.0, "errors": [], "phases": {
            "long_short": {"short": {"ttft_ms": ttft, "sent": 3, "completed": 3}, "streams": {"itl_ms": ttft},
                           "long": {"ttft_ms": [900.0]}, "errors": [], "meets_goal": True},
            "overlap": {"batch": {**run, "scheduler": {"gpu_idle_fraction": 0.1}},
                        "batch1": {**run, "scheduler": {}}},
            "throughput": {"random": {"runs": [run], "kv_waste": {"time_avg_unused_fraction": 0.01,
                                                                  "aggregate_unused_fraction": 0.01,
                                                                  "meets_goal": True}},
                           "shared-prefix": {**run, "cache_hit_rate": 0.9}}}},
        "B": {"description": "chunk 2048", "flags": ["--chunked-prefill-size", "2048"], "skipped": "budget",
              "errors": [], "phases": {}}}}
    report["summary"] = rows = gpu_phases.summary_rows(report)
    assert [r["what"] for r in rows] == ["long_short", "overlap batch", "overlap batch1", "random c=4",
                                         "kv waste (random sweep)", "shared-prefix"]
    assert rows[0]["short_ttft_p99"] == 3.0 and rows[1]["gpu_idle_fraction"] == 0.1
    table = gpu_phases.format_table(report)
    assert "config B (chunk 2048): start - s; budget" in table and "short_ttft_p99=3.0" in table
    samples = {"A": {"short_send_s": [0.1, 0.5], "short_ttft_ms": [30.0, 250.0], "long_send_s": [0.2],
                     "itl_ms": [10.0, 12.0, 400.0]},
               "C": {"short_send_s": [], "short_ttft_ms": [], "itl_ms": []}}
    png = plot_long_short(samples, tmp_path / "ls.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_live_group_pids_sees_a_process_group_and_ignores_zombies() -> None:
    import os
    import subprocess

    p = subprocess.Popen(["sleep", "30"], preexec_fn=os.setpgrp)
    try:
        assert gpu_serving.live_group_pids(p.pid) == [p.pid]
        p.kill()
        for _ in range(100):  # killed but not yet reaped: a zombie, not counted
            if gpu_serving.live_group_pids(p.pid) == []:
                break
            time.sleep(0.02)
        assert gpu_serving.live_group_pids(p.pid) == []
    finally:
        p.kill()
        p.wait()
