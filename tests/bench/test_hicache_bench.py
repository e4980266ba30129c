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
