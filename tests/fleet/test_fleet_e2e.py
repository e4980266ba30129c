"""`radixrt launch-fleet` on the default model behind the real smg gateway: two served names (alpha x1,
beta x2), one base URL and one key. Tests run in file order on one module-scoped fleet: after the
routing, cache and policy tests, one kills a replica (which restarts while the Agents SDK test runs),
then the gateway is killed, then the whole fleet is stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.server_proc import free_port
from tests.agent_tools import run_weather_agent

pytest.importorskip("smg", reason="radixrt[fleet] (the smg gateway) is not installed")

from radixrt.gateway import Gateway  # noqa: E402

KEY = "fleet-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
WORKER_ARGS = ["--device", "cpu", "--max-total-tokens", "4096"]
START_TIMEOUT_S = 600.0


@dataclass
class Fleet:
    proc: subprocess.Popen
    port: int
    log_dir: Path
    killed: dict[str, Any] | None = None  # the replica test_killed_replica_model_stays_served killed

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def state(self) -> dict[str, Any]:
        return json.loads((self.log_dir / "state.json").read_text())

    def workers(self, model: str) -> list[dict[str, Any]]:
        return [w for w in self.state()["workers"] if w["model"] == model]

    def log(self) -> str:
        return (self.log_dir / "fleet.log").read_text(errors="replace")

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def fleet(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    port = free_port()
    config = {"gateway": {"port": port, "api_key": KEY},
              "models": [{"name": "alpha", "model_path": str(model_dir), "args": WORKER_ARGS},
                         {"name": "beta", "model_path": str(model_dir), "replicas": 2, "args": WORKER_ARGS,
                          "policy": "cache_aware"}]}
    (tmp / "fleet.json").write_text(json.dumps(config))
    log_dir = tmp / "logs"
    log_dir.mkdir()
    with open(log_dir / "fleet.log", "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "radixrt.cli", "launch-fleet", "--config",
                                 str(tmp / "fleet.json"), "--log-dir", str(log_dir)],
                                stdout=out, stderr=subprocess.STDOUT)
    f = Fleet(proc, port, log_dir)
    deadline = time.monotonic() + START_TIMEOUT_S
    while "fleet: ready" not in f.log():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the fleet did not start:\n{f.log()[-4000:]}")
        time.sleep(0.5)
    yield f
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _chat(c: openai.OpenAI, model: str, text: str, **kw: Any) -> Any:
    return c.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                     max_tokens=4, temperature=0, **kw)


def test_one_url_and_key_route_by_model(fleet: Fleet) -> None:
    c = fleet.client()
    assert {"alpha", "beta"} <= {m.id for m in c.models.list().data}
    for model in ("alpha", "beta"):
        assert _chat(c, model, "Hello").model == model
    with pytest.raises(openai.APIStatusError) as e:
        _chat(c, "no-such-model", "Hello")
    assert e.value.status_code in (400, 404)


def test_gateway_needs_the_key(fleet: Fleet) -> None:
    with pytest.raises(openai.AuthenticationError):
        _chat(fleet.client("wrong-key"), "alpha", "Hello")
    body = {"model": "alpha", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert httpx.post(f"{fleet.url}/v1/chat/completions", json=body).status_code == 401  # no key


def test_worker_routes_for_the_gateway(fleet: Fleet) -> None:
    url = fleet.workers("alpha")[0]["url"]
    assert httpx.get(f"{url}/health").status_code == 200  # open
    for route in ("/server_info", "/get_server_info", "/model_info", "/get_model_info", "/v1/loads",
                  "/get_load", "/health_generate", "/metrics", "/v1/models"):
        assert httpx.get(f"{url}{route}").status_code == 401, route
        r = httpx.get(f"{url}{route}", headers=AUTH, timeout=120)
        assert r.status_code == 200, (route, r.text)
        assert KEY not in r.text, route  # never a secret
    assert httpx.post(f"{url}/flush_cache").status_code == 401
    _flush([url])
    info = httpx.get(f"{url}/server_info", headers=AUTH).json()
    assert info["served_model_name"] == "alpha" and info["api_key"] == "***"
    assert httpx.get(f"{url}/model_info", headers=AUTH).json()["is_generation"] is True
    assert httpx.get(f"{url}/version", headers=AUTH).status_code == 404  # else smg takes it for vLLM
    loads = httpx.get(f"{url}/v1/loads", headers=AUTH).json()
    assert loads["dp_rank_count"] == 1 and loads["loads"][0]["max_total_num_tokens"] == 4096
    (load,) = httpx.get(f"{url}/get_load", headers=AUTH).json()
    assert set(load) == {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}
    gen = httpx.get(f"{url}/health_generate", headers=AUTH, timeout=120).json()
    assert gen["completion_tokens"] == 1
    # a DP-aware gateway adds data_parallel_rank to bodies: accepted and ignored, direct and via smg
    body = {"model": "alpha", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "data_parallel_rank": 0}
    for base in (url, fleet.url):
        r = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
    gen_body = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}, "data_parallel_rank": 0}
    assert httpx.post(f"{url}/generate", json=gen_body, headers=AUTH, timeout=120).status_code == 200


def _conversation(c: openai.OpenAI, model: str) -> list[int]:
    """Four greedy turns; cached_tokens of each."""
    msgs: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful assistant. " * 8}]
    cached = []
    for turn in range(4):
        msgs.append({"role": "user", "content": f"Tell me fact number {turn} about the sea."})
        r = c.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
        msgs.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
    return cached


def _flush(urls: list[str]) -> None:
    """Empty the caches; a server refuses (400) while a request runs, smg's /health probes (one-token
    generations) included, so retry a few seconds."""
    for u in urls:
        for _ in range(50):
            r = httpx.post(f"{u}/flush_cache", headers=AUTH, timeout=60)
            if r.status_code != 400:
                break
            time.sleep(0.2)
        assert r.status_code == 200, r.text


def test_multi_turn_through_the_gateway_hits_the_cache_as_one_server_does(fleet: Fleet) -> None:
    beta = [w["url"] for w in fleet.workers("beta")]
    _flush(beta)
    via_gateway = _conversation(fleet.client(), "beta")
    _flush(beta)
    direct = openai.OpenAI(base_url=f"{beta[0]}/v1", api_key=KEY, max_retries=0, timeout=300)
    one_server = _conversation(direct, "beta")
    assert all(n > 0 for n in one_server[1:]), one_server
    assert via_gateway == one_server  # cache_aware kept the conversation on one replica


def _finished(url: str) -> int:
    text = httpx.get(f"{url}/metrics", headers=AUTH, timeout=30).text
    m = re.search(r'^radixrt_requests_total\{outcome="ok"\} ([0-9.]+)', text, re.M)
    return int(float(m.group(1))) if m else 0


@pytest.mark.parametrize("policy", ["round_robin", "power_of_two", "prefix_hash", "cache_aware"])
def test_each_gateway_policy_routes_to_the_replicas(fleet: Fleet, tmp_path: Path, policy: str) -> None:
    beta = [w["url"] for w in fleet.workers("beta")]
    gw = Gateway("127.0.0.1", free_port(), KEY, policy, tmp_path / "gateway.log")
    gw.start()
    try:
        for u in beta:
            gw.register(u)
        deadline = time.monotonic() + 60
        while not all(gw.workers().get(u, {}).get("is_healthy") for u in beta):
            assert time.monotonic() < deadline, gw.workers()
            time.sleep(0.3)
        before = [_finished(u) for u in beta]
        c = openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key=KEY, max_retries=0, timeout=300)
        same = policy in ("cache_aware", "prefix_hash")  # one long prompt, sent 4 times
        for i in range(4):
            _chat(c, "beta", "Say something about ships. " * 12 if same else f"Count to {i}.")
        served = [_finished(u) - b for u, b in zip(beta, before, strict=True)]
        assert sum(served) == 4, served
        if policy == "round_robin":
            assert served == [2, 2], served
        if same:
            assert sorted(served) == [0, 4], served  # the prefix pins the prompt to one replica
    finally:
        gw.stop()


def test_killed_replica_model_stays_served(fleet: Fleet) -> None:
    victim = fleet.killed = fleet.workers("beta")[0]
    os.kill(victim["pid"], signal.SIGKILL)
    c = fleet.client()
    for i in range(3):
        assert _chat(c, "beta", f"Hello number {i}").model == "beta"


def test_openai_agents_sdk_through_the_gateway(fleet: Fleet) -> None:
    agents = pytest.importorskip("agents")
    result, calls = run_weather_agent(agents, openai, f"{fleet.url}/v1", "alpha", KEY)
    assert calls and result.final_output == f"18 C and sunny in {calls[0]}"


def test_the_fleet_restarted_the_killed_replica(fleet: Fleet) -> None:
    """beta[0], killed two tests ago (it restarts while the Agents SDK test runs)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        w = fleet.workers("beta")[0]
        if w["restarts"] == 1 and w["state"] == "healthy":
            break
        assert time.monotonic() < deadline and fleet.proc.poll() is None, fleet.log()[-3000:]
        time.sleep(0.5)
    assert fleet.killed is not None and "beta[0]: exited with -9" in fleet.log()
    assert w["url"] == fleet.killed["url"] and w["pid"] != fleet.killed["pid"]  # same port, new process
    gateway = Gateway("127.0.0.1", fleet.port, KEY, "cache_aware", fleet.log_dir / "unused.log")
    while not gateway.workers().get(w["url"], {}).get("is_healthy"):
        assert time.monotonic() < deadline, gateway.workers()
        time.sleep(0.3)
    assert httpx.get(f"{w['url']}/health").status_code == 200


def test_killed_gateway_is_restarted_with_every_worker(fleet: Fleet) -> None:
    old = fleet.state()["gateway"]["pid"]
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 120
    urls = {w["url"] for w in fleet.state()["workers"]}
    gateway = Gateway("127.0.0.1", fleet.port, KEY, "cache_aware", fleet.log_dir / "unused.log")
    while True:
        g = fleet.state()["gateway"]
        seen = gateway.workers() if g["alive"] and g["pid"] != old else {}
        if urls <= {u for u, w in seen.items() if w.get("is_healthy")}:
            break
        assert time.monotonic() < deadline and fleet.proc.poll() is None, fleet.log()[-3000:]
        time.sleep(0.3)
    assert "gateway exited with -9" in fleet.log()
    for model in ("alpha", "beta"):
        assert _chat(fleet.client(), model, "Hello again").model == model


def test_sigterm_stops_every_process(fleet: Fleet) -> None:
    psutil = pytest.importorskip("psutil")
    tree = psutil.Process(fleet.proc.pid).children(recursive=True)
    assert len(tree) >= 1 + 3 * 4  # the gateway, and three launchers with three children each
    fleet.proc.send_signal(signal.SIGTERM)
    assert fleet.proc.wait(timeout=60) == 0
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive, alive
