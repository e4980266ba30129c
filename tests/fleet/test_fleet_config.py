"""launch-fleet configuration (file + flags), restart back-off, worker commands, and the load figures
the gateway reads from a worker; no processes are started."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from radixrt.cli import build_parser
from radixrt.config import ServerArgs
from radixrt.fleet import Fleet, backoff_s
from radixrt.fleet_config import FleetConfig, ModelSpec, build_config
from radixrt.gateway import Gateway
from tokenizer_proc.gateway_routes import scheduler_load

TOML = """
[gateway]
port = 31000
api_key = "k"
policy = "round_robin"
args = ["--log-level", "info"]

[[models]]
name = "qwen"
model_path = "/m/qwen"
replicas = 2
gpus = ["0", "1"]
args = ["--mem-fraction-static", "0.4"]

[[models]]
name = "llama"
model_path = "/m/llama"
policy = "cache_aware"
"""


def _ns(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["launch-fleet", *argv])


def test_file_then_flags(tmp_path: Path) -> None:
    (tmp_path / "f.toml").write_text(TOML)
    cfg = build_config(_ns("--config", str(tmp_path / "f.toml"), "--replicas", "llama=3", "--port", "32000",
                           "--model", "tiny=", "--worker-args", "tiny=--max-total-tokens 4096"))
    assert (cfg.port, cfg.api_key, cfg.policy, cfg.gateway_args) == (32000, "k", "round_robin",
                                                                    ["--log-level", "info"])
    by = {m.name: m for m in cfg.models}
    assert by["qwen"].gpus == ["0", "1"] and by["qwen"].args == ["--mem-fraction-static", "0.4"]
    assert by["llama"].replicas == 3 and by["llama"].policy == "cache_aware"
    assert by["tiny"].model_path is None and by["tiny"].args == ["--max-total-tokens", "4096"]
    assert cfg.num_workers == 6


def test_json_file_is_read_too(tmp_path: Path) -> None:
    (tmp_path / "f.json").write_text(json.dumps({"gateway": {"api_key": "k"}, "models": [{"name": "a"}]}))
    cfg = build_config(_ns("--config", str(tmp_path / "f.json")))
    assert [m.name for m in cfg.models] == ["a"] and cfg.port == 30000 and cfg.policy == "cache_aware"


def test_gateway_command_sets_the_prefix_hash_span_and_extra_args_win(tmp_path: Path) -> None:
    """The fleet's smg hashes 64 tokens' worth (256 characters) of a request for prefix_hash, on every
    policy (a model's label may pick prefix_hash); a user's --gateway-args come later and win."""
    cmd = Gateway("127.0.0.1", 1, "k", "prefix_hash", tmp_path / "g.log").command()
    assert cmd[cmd.index("--policy") + 1] == "prefix_hash"
    assert cmd[cmd.index("--prefix-token-count") + 1] == "64"
    cmd = Gateway("127.0.0.1", 1, "k", "cache_aware", tmp_path / "g.log",
                  ("--prefix-token-count", "512")).command()
    assert cmd[cmd.index("--prefix-token-count") + 1] == "64"  # the fleet's, before the user's
    assert cmd[-2:] == ["--prefix-token-count", "512"]


@pytest.mark.parametrize("argv, message", [
    ((), "no models"),
    (("--model", "a=/x"), "API key"),
    (("--model", "a=/x", "--api-key", "k", "--replicas", "b=2"), "no model named b"),
    (("--model", "a=/x", "--api-key", "k", "--replicas", "a=2", "--gpus", "a=0"), "one CUDA_VISIBLE"),
    (("--model", "a=/x", "--api-key", "k", "--replicas", "a=0"), "replicas must be >= 1"),
    (("--model", "a=/x", "--api-key", "k", "--worker-args", "a=--port 5"), "set by the fleet"),
    (("--model", "a", "--api-key", "k"), "NAME=VALUE"),
])
def test_bad_configs_name_the_problem(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_config(_ns(*argv))


def test_bad_policy_and_duplicate_names() -> None:
    with pytest.raises(ValueError, match="policy"):
        ModelSpec("a", policy="fastest")
    with pytest.raises(ValueError, match="unique"):
        FleetConfig(models=[ModelSpec("a"), ModelSpec("a")], api_key="k")


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_s(30) == 60.0


def test_worker_commands_carry_key_name_port_and_gpu(tmp_path: Path) -> None:
    cfg = FleetConfig(models=[ModelSpec("q", "/m/q", replicas=2, gpus=["2", "3"], args=["--page-size", "1"])],
                      api_key="k", worker_base_port=40000, log_dir=tmp_path)
    w0, w1 = Fleet(cfg).workers
    cmd = w1.command("k")
    assert cmd[cmd.index("--port") + 1] == "40001" and cmd[cmd.index("--api-key") + 1] == "k"
    assert cmd[cmd.index("--served-model-name") + 1] == "q" and cmd[-2:] == ["--page-size", "1"]
    assert (w0.env()["CUDA_VISIBLE_DEVICES"], w1.env()["CUDA_VISIBLE_DEVICES"]) == ("2", "3")


def test_scheduler_load_counts_protected_pages_as_used() -> None:
    ctx = SimpleNamespace(args=ServerArgs(max_running_requests=8))
    data = {"worker": {"page_size": 16}, "scheduler": {"num_total_pages": 100, "num_protected_pages": 25,
                                                       "num_evictable_pages": 50, "num_running_reqs": 2,
                                                       "num_waiting_reqs": 3, "hit_rate": 0.5}}
    load = scheduler_load(ctx, data)  # type: ignore[arg-type]
    assert (load["num_used_tokens"], load["max_total_num_tokens"], load["token_usage"]) == (400, 1600, 0.25)
    assert (load["num_total_reqs"], load["utilization"], load["cache_hit_rate"]) == (5, 0.25, 0.5)
