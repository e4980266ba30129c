"""bench/hicache_bench.py --quick runs on CPU and reports both modes, the tier hitting the host."""

from __future__ import annotations

import json
from pathlib import Path

from bench import hicache_bench


def test_quick_run_reports_tier_off_and_on(tmp_path: Path) -> None:
    out = tmp_path / "hicache.json"
    assert hicache_bench.main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    off, on = report["results"]
    assert (off["mode"], on["mode"]) == ("tier-off", "tier-on")
    assert on["hicache_host_hit_tokens"] > 0 and on["hicache_load_bytes"] > 0
    assert on["cache_hit_rate"] > off["cache_hit_rate"]
    assert set(report["ratios"]) >= {"output_tok_s", "cache_hit_rate", "ttft_short_p99"}


def test_ratios_are_none_where_tier_off_is_zero() -> None:
    off = {"output_tok_s": 100.0, "cache_hit_rate": 0.0, "ttft_short_p99_s": 2.0}
    on = {"output_tok_s": 250.0, "cache_hit_rate": 0.7, "ttft_short_p99_s": 0.5, "load_gib_per_s": 40.0}
    r = hicache_bench.ratios(off, on, 50.0)
    assert r == {"output_tok_s": 2.5, "cache_hit_rate": None, "ttft_short_p99": 0.25,
                 "load_bw_vs_pinned_h2d": 0.8}
    assert hicache_bench.ratios(off, {**on, "load_gib_per_s": None}, None)["load_bw_vs_pinned_h2d"] is None
