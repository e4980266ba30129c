"""The configuration of `radixrt launch-fleet`: models, their replicas, and the gateway in front.

From a TOML or JSON file (`--config`), then overridden by flags. The file:

    [gateway]                      # all optional
    host = "127.0.0.1"
    port = 30000
    policy = "cache_aware"         # the default; also prefix_hash, power_of_two, round_robin, random
    api_key = "sk-..."             # or --api-key (required: one key for clients, gateway, workers)
    args = ["--log-level", "warn"] # extra `smg launch` flags

    [[models]]
    name = "qwen"                  # the served model name clients put in `model`
    model_path = "/models/qwen2.5-7b"   # omitted: the default model
    replicas = 2
    args = ["--max-total-tokens", "65536"]   # `radixrt launch-server` flags for every replica
    gpus = ["0", "1"]              # CUDA_VISIBLE_DEVICES of replica i (omitted: inherited)
    policy = "cache_aware"         # this model's routing policy (smg's per-model policy label)

Flags (`--model NAME=PATH`, `--replicas NAME=N`, `--gpus NAME=0,1`, `--worker-args NAME=FLAGS`) add or
override models. Everything is checked here (ValueError with a one-line message), before any process
starts.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixrt.gateway import DEFAULT_POLICY

POLICIES = ("cache_aware", "power_of_two", "round_robin", "prefix_hash", "random", "least_load")
_RESERVED_WORKER_FLAGS = ("--host", "--port", "--api-key", "--served-model-name", "--model-path")


@dataclass(slots=True)
class ModelSpec:
    """One served model name and its replicas (one `radixrt launch-server` each)."""

    name: str  # served model name (`model` in requests), unique in the fleet
    model_path: str | None = None  # None: the default model
    replicas: int = 1
    args: list[str] = field(default_factory=list)  # launch-server flags of every replica
    gpus: list[str] = field(default_factory=list)  # CUDA_VISIBLE_DEVICES per replica; [] = inherit
    policy: str | None = None  # None: the gateway's --policy

    def __post_init__(self) -> None:
        if not self.name or any(c.isspace() for c in self.name):
            raise ValueError(f"model name {self.name!r}: must be non-empty without spaces")
        if self.replicas < 1:
            raise ValueError(f"model {self.name}: replicas must be >= 1, got {self.replicas}")
        if self.gpus and len(self.gpus) != self.replicas:
            raise ValueError(f"model {self.name}: gpus lists {len(self.gpus)} entries for "
                             f"{self.replicas} replicas (one CUDA_VISIBLE_DEVICES value per replica)")
        if self.policy is not None and self.policy not in POLICIES:
            raise ValueError(f"model {self.name}: policy {self.policy!r} is not one of {POLICIES}")
        for flag in self.args:
            if flag.split("=")[0] in _RESERVED_WORKER_FLAGS:
                raise ValueError(f"model {self.name}: {flag.split('=')[0]} is set by the fleet")


@dataclass(slots=True)
class FleetConfig:
    """The whole fleet: the gateway's address, key and policy, and the models behind it."""

    models: list[ModelSpec]
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    policy: str = DEFAULT_POLICY
    gateway_args: list[str] = field(default_factory=list)  # extra `smg launch` flags
    worker_host: str = "127.0.0.1"
    worker_base_port: int = 0  # 0: free ports picked at start; else base, base + 1, ...
    log_dir: Path | None = None  # worker / gateway logs and state.json; None: a temp dir

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("no models: give --config FILE or --model NAME=PATH")
        names = [m.name for m in self.models]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"model names must be unique: {sorted(dup)}")
        if self.policy not in POLICIES:
            raise ValueError(f"--policy {self.policy!r} is not one of {POLICIES}")
        if not self.api_key:
            raise ValueError("the fleet needs an API key (--api-key or [gateway] api_key)")

    @property
    def num_workers(self) -> int:
        return sum(m.replicas for m in self.models)


def read_file(path: Path) -> dict[str, Any]:
    """The raw table of a .toml or .json fleet file. Raises ValueError on a bad file."""
    try:
        if path.suffix == ".json":
            return json.loads(path.read_text())
        import tomllib  # Python >= 3.11; on 3.10 use a .json file

        return tomllib.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--config {path}: {e}") from None


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"{flag} {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def _model_from_table(t: dict[str, Any]) -> ModelSpec:
    known = {"name", "model_path", "replicas", "args", "gpus", "policy"}
    unknown = set(t) - known
    if unknown:
        raise ValueError(f"[[models]] {t.get('name')}: unknown keys {sorted(unknown)}")
    args = t.get("args", [])
    return ModelSpec(name=str(t.get("name", "")), model_path=t.get("model_path"),
                     replicas=int(t.get("replicas", 1)),
                     args=shlex.split(args) if isinstance(args, str) else [str(a) for a in args],
                     gpus=[str(g) for g in t.get("gpus", [])], policy=t.get("policy"))


def build_config(ns: Any) -> FleetConfig:
    """A FleetConfig from parsed `launch-fleet` flags (see add_cli_args) over the --config file.

    Raises:
        ValueError: a bad file, flag or combination (the message names it).
    """
    raw = read_file(Path(ns.config)) if ns.config else {}
    gw = raw.get("gateway", {})
    tables = {t.get("name"): dict(t) for t in raw.get("models", [])}
    for name, path in _pairs(ns.model, "--model").items():
        tables.setdefault(name, {"name": name})["model_path"] = path or None
    for flag, key in (("replicas", "replicas"), ("gpus", "gpus"), ("worker_args", "args")):
        for name, value in _pairs(getattr(ns, flag), f"--{flag.replace('_', '-')}").items():
            if name not in tables:
                raise ValueError(f"--{flag.replace('_', '-')} {name}=...: no model named {name}")
            tables[name][key] = value.split(",") if key == "gpus" else int(value) if key == "replicas" \
                else shlex.split(value)
    models = [_model_from_table(t) for t in tables.values()]
    log_dir = ns.log_dir or gw.get("log_dir")
    return FleetConfig(
        models=models, host=ns.host or gw.get("host", "127.0.0.1"),
        port=int(ns.port or gw.get("port", 30000)),
        api_key=ns.api_key or gw.get("api_key"),
        policy=ns.policy or gw.get("policy", DEFAULT_POLICY),
        gateway_args=list(gw.get("args", [])) + shlex.split(ns.gateway_args or ""),
        worker_base_port=int(ns.worker_base_port or gw.get("worker_base_port", 0)),
        log_dir=Path(log_dir) if log_dir else None)


def add_cli_args(p: Any) -> None:
    """The `radixrt launch-fleet` flags on argparse parser `p`."""
    p.add_argument("--config", help="TOML or JSON fleet file (see docs/fleet.md).")
    p.add_argument("--model", action="append", metavar="NAME=PATH",
                   help="Serve PATH as NAME (repeatable; empty PATH: the default model).")
    p.add_argument("--replicas", action="append", metavar="NAME=N", help="Replicas of model NAME.")
    p.add_argument("--gpus", action="append", metavar="NAME=D0,D1",
                   help="CUDA_VISIBLE_DEVICES of each replica of NAME, comma-separated.")
    p.add_argument("--worker-args", action="append", metavar="NAME=FLAGS",
                   help="`radixrt launch-server` flags for every replica of NAME (one shell-quoted string).")
    p.add_argument("--host", help="Gateway host (default 127.0.0.1).")
    p.add_argument("--port", type=int, help="Gateway port (default 30000).")
    p.add_argument("--api-key", help="The one key for clients, gateway and workers.")
    p.add_argument("--policy", choices=POLICIES, help=f"Default routing policy (default {DEFAULT_POLICY}).")
    p.add_argument("--gateway-args", help="Extra `smg launch` flags (one shell-quoted string).")
    p.add_argument("--worker-base-port", type=int, help="First worker port (default: free ports).")
    p.add_argument("--log-dir", help="Directory for worker and gateway logs and state.json.")
