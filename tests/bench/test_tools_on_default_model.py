"""A quick run of each benchmark tool on the real default model (a handful of requests): the JSON
has every field and the figures are consistent (tokens counted equal tokens returned)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import offline
from bench.serving import RUN_FIELDS, STAT_FIELDS, BenchConfig, run_benchmark
from bench.workloads import WorkloadSpec
from tests.conftest import Server

VOCAB = 49152


def test_serving_benchmark_against_the_real_server(server: Server, tmp_path: Path) -> None:
    # the default --vocab-size (150000) is above this model's 49152: run_benchmark caps it from
    # /get_server_info, so default flags work against the default server
    spec = WorkloadSpec(name="multi-turn", num_clients=2, num_turns=2, input_len=24, turn_len=8, output_len=5)
    assert spec.vocab_size > VOCAB
    report = run_benchmark(BenchConfig(base_url=server.base_url, workload=spec, disable_tqdm=True,
                                       output_json=str(tmp_path / "s.json"), plot_dir=str(tmp_path)))
    saved = json.loads((tmp_path / "s.json").read_text())
    run = saved["runs"][0]
    assert set(RUN_FIELDS) <= run.keys()
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(STAT_FIELDS) <= run[key].keys()
    assert run["completed"] == 4 and run["failed"] == 0
    assert run["total_output_tokens_stream"] == run["total_output_tokens_usage"] == 4 * 5
    assert run["token_counts_consistent"] is True
    assert run["answer_ids_source"] != "synthetic"  # real answers resent: turn 2 hits the cache
    assert run["cached_tokens"] > 0
    assert report["plots"] and all(Path(p).exists() for p in report["plots"])


def test_offline_benchmark_counts_every_token(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    assert offline.main(["--workload", "shared-prefix", "--prompts-per-group", "3",
                         "--system-prompt-len", "40", "--question-len", "6", "--output-len", "4",
                         "--vocab-size", str(VOCAB),
                         "--model-path", str(model_dir), "--device", "cpu", "--max-total-tokens", "4096",
                         "--output-json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["num_requests"] == 3
    assert r["total_output_tokens"] == r["total_output_tokens_expected"] == 12
    assert r["token_counts_consistent"] is True
    assert r["cached_tokens"] >= 2 * 32  # two of three prompts reuse the 40-token prefix (page 16)
    for key in ("wall_s", "output_throughput", "input_throughput", "cache_hit_rate"):
        assert r[key] > 0
