"""The soak harness (bench/soak.py), quick variant on the shared server, and the long run behind the
`stress` marker (>= 2,000 requests at concurrency 64 with 10% disconnects on the default model)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.server_proc import Server, start_server
from bench.soak import SoakConfig, format_report, soak


def test_quick_soak_loses_nothing(server: Server) -> None:
    cfg = SoakConfig(num_requests=120, concurrency=16, disconnect_frac=0.1, malformed_frac=0.08,
                     max_tokens=4, long_words=120, warmup=4, seed=3)
    report = asyncio.run(soak(server.base_url, cfg, pid=server.proc.pid))
    print(format_report(report))
    assert report.problems == [], format_report(report)
    c = report.counts
    assert c["requests"] == 120 and c["http_5xx"] == 0 and c["hung"] == 0
    assert c["abandoned"] > 0 and c["malformed"] > 0 and c["completed_ok"] == c["complete"]


@pytest.mark.stress
def test_long_soak(model_dir: Path, tmp_path: Path) -> None:
    s = start_server(model_dir, tmp_path, "--max-total-tokens", "65536", timeout_s=600,
                     env={"RADIXRT_DEBUG_INVARIANTS": "1"})
    try:
        cfg = SoakConfig(num_requests=2000, concurrency=64, disconnect_frac=0.1, malformed_frac=0.05,
                         max_tokens=8, long_words=400, request_timeout_s=900)
        report = asyncio.run(soak(s.base_url, cfg, pid=s.proc.pid))
    finally:
        s.stop()
    print(format_report(report))
    assert report.problems == [], format_report(report)
