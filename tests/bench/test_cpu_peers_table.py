"""bench/cpu_peers.py's table: ratios against vLLM's default and against vLLM on all cores."""

from __future__ import annotations

from bench import cpu_peers


def _result(cold: float, mt_tok_s: float) -> dict:
    return {"ttft": {"cold_ttft_s": cold, "cached_ttft_s": cold / 10},
            "multi_turn": {"duration_s": 10.0, "output_tok_s": mt_tok_s},
            "random_loadgen": {"output_tok_s": 30.0, "median_tpot_ms": 70.0}}


def test_table_ratios_and_targets_with_and_without_the_all_cores_peer() -> None:
    report = {"results": {"radixrt": _result(3.0, 30.0), "vllm": _result(6.0, 25.0)}}
    lines = cpu_peers.format_table(report).splitlines()
    assert lines[0].count("|") == 6  # no all-cores columns when that peer did not run
    cold = next(line for line in lines if line.startswith("| cold TTFT"))
    assert "| 3.00 | 6.00 | 0.50x | <= 1x: met |" in cold
    mt = next(line for line in lines if line.startswith("| multi-turn: output"))
    assert "1.20x | >= 1.5x: NOT met" in mt
    vb = next(line for line in lines if "vllm bench serve`: output" in line)
    assert "| - | - | - |" in vb  # missing figures print as -, no ratio

    report["results"]["vllm-allcores"] = _result(2.0, 40.0)
    lines = cpu_peers.format_table(report).splitlines()
    assert lines[0].count("|") == 8 and lines[1].count("|") == 8
    cold = next(line for line in lines if line.startswith("| cold TTFT"))
    assert cold.endswith("| 2.00 | 1.50x |")
    mt = next(line for line in lines if line.startswith("| multi-turn: output"))
    assert mt.endswith("| 40.0 | 0.75x |")


def test_all_cores_env_names_every_core_and_reserves_none() -> None:
    env = cpu_peers.all_cores_env()
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    cores = [int(c) for c in env["VLLM_CPU_OMP_THREADS_BIND"].split(",")]
    assert cores == sorted(set(cores)) and len(cores) >= 1
