"""HF baselines on a tiny random Llama (hidden 64, 2 layers) on CPU, and the ratio report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.peers import (
    BASELINE_FIELDS,
    BASELINES,
    PeerConfig,
    compare,
    format_ratios,
    hf_cb_round,
    hf_generate_round,
    load_model,
    run_peers,
)
from bench.workloads import WorkloadSpec

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
        "max_position_embeddings": 512, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
CB_SMALL = {"block_size": 32, "num_blocks": 16, "max_batch_tokens": 256}  # defaults size for a GPU


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "config.json"
    path.write_text(json.dumps(TINY))
    return path


def _cfg(tiny_config: Path, **kw) -> PeerConfig:
    return PeerConfig(model_config=str(tiny_config), device="cpu", batch_size=2, cb_block_size=32,
                      cb_num_blocks=16, cb_max_batch_tokens=256, **kw)


def test_run_peers_both_baselines_json(tiny_config: Path, tmp_path: Path) -> None:
    spec = WorkloadSpec(name="random", num_prompts=5, input_len=12, output_len=5, vocab_size=1000,
                        min_token_id=10)
    out = tmp_path / "peers.json"
    report = run_peers(_cfg(tiny_config, workload=spec, output_json=str(out)))
    assert json.loads(out.read_text()) == report
    assert report["device"] == "cpu" and report["model"]["random_weights"]
    assert report["model"]["shape"]["hidden_size"] == 64 and report["workload"]["num_requests"] == 5
    assert list(report["baselines"]) == list(BASELINES)
    for b in report["baselines"].values():
        assert set(BASELINE_FIELDS) <= set(b)
        assert b["output_tokens"] == 25 and b["input_tokens"] == 60 and b["exact_output_lens"]
        assert b["wall_s"] > 0 and b["output_tok_s"] == pytest.approx(25 / b["wall_s"])


def test_multi_turn_rounds_and_per_request_lengths(tiny_config: Path) -> None:
    spec = WorkloadSpec(name="multi-turn", num_clients=3, num_turns=2, input_len=10, turn_len=3, output_len=4,
                        vocab_size=1000, min_token_id=10)
    report = run_peers(_cfg(tiny_config, workload=spec, warmup=False, repeat=3))
    for b in report["baselines"].values():
        runs = b["runs_output_tok_s"]
        assert len(runs) == 3 and b["output_tok_s"] == sorted(runs)[1]  # the median run is reported
        assert b["num_rounds"] == 2 and b["output_tokens"] == 24
        assert b["input_tokens"] == 3 * 10 + 3 * (10 + 4 + 3)


def test_both_paths_agree_on_greedy_tokens(tiny_config: Path) -> None:
    model, _ = load_model(PeerConfig(model_config=str(tiny_config), device="cpu"))
    prompts = [[10 + (7 * i + j) % 900 for j in range(9)] for i in range(3)]
    lens = [6, 3, 5]  # per-request lengths: a static batch runs to 6 and is cut
    static, _ = hf_generate_round(model, prompts, lens, batch_size=3)
    paged, _ = hf_cb_round(model, prompts, lens, CB_SMALL)
    assert [len(x) for x in static] == lens and [len(x) for x in paged] == lens
    assert static == paged


def test_compare_and_format_ratios() -> None:
    wl = {"name": "random", "seed": 0, "num_requests": 4, "total_output_len": 40, "total_new_input_len": 80}
    serving = {"workload": wl, "runs": [
        {"output_throughput": 500.0, "max_concurrency": 4},
        {"output_throughput": 800.0, "max_concurrency": 16}]}
    peers = {"workload": dict(wl), "baselines": {
        "hf_generate": {"output_tok_s": 200.0, "wall_s": 0.2},
        "hf_continuous_batching": {"output_tok_s": 100.0, "wall_s": 0.4}}}
    bound = {"output_tok_s": 1600.0, "total_s": 0.025, "prefix_reuse": "compute"}
    cmp = compare(serving, peers, bound)
    assert cmp["workload_match"] and cmp["radixrt_max_concurrency"] == 16
    assert cmp["vs"]["hf_generate"]["ratio"] == pytest.approx(4.0)
    assert cmp["vs"]["hf_continuous_batching"]["ratio"] == pytest.approx(8.0)
    assert cmp["roofline"]["fraction_of_bound"] == pytest.approx(0.5)
    text = format_ratios(cmp)
    assert "4.00x" in text and "8.00x" in text and "50.0%" in text and "WARNING" not in text
    peers["workload"]["seed"] = 1
    assert "WARNING" in format_ratios(compare(serving, peers))


def test_config_needs_exactly_one_model_source() -> None:
    with pytest.raises(ValueError):
        PeerConfig()
    with pytest.raises(ValueError):
        PeerConfig(model_path="a", model_config="b")
    with pytest.raises(ValueError):
        PeerConfig(model_config="qwen2.5-7b", baselines=("vllm",))
    with pytest.raises(ValueError, match="repeat"):
        PeerConfig(model_config="qwen2.5-7b", repeat=0)
