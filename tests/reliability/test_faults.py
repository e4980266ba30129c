"""Faults under load: SIGKILL of each child process, SIGTERM with a graceful drain, /health when the
scheduler stops answering. Each test starts its own server (the fault ends it)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from bench.server_proc import Server, pid_alive, start_server

MODEL = "SmolLM2-135M-Instruct"
BODY = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}


def _pids(s: Server) -> tuple[dict[str, int], Path]:
    deadline = time.monotonic() + 30
    while True:
        log = s.log()
        pids = {m.group(1): int(m.group(2)) for m in re.finditer(r"(\w+) process ready \(pid (\d+)\)", log)}
        if len(pids) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return pids, Path(re.search(r"ipc dir (\S+)", log).group(1))


class Streams:
    """n streaming clients in threads; `lines[i]` what client i read, `errors[i]` how it ended."""

    def __init__(self, s: Server, n: int, body: dict) -> None:
        self.lines: list[list[str]] = [[] for _ in range(n)]
        self.errors: list[str | None] = [None] * n
        self.started = [threading.Event() for _ in range(n)]
        self.threads = [threading.Thread(target=self._run, args=(s, i, body), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, s: Server, i: int, body: dict) -> None:
        try:
            with httpx.stream("POST", s.base_url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line:
                        self.lines[i].append(line)
                        self.started[i].set()
        except httpx.HTTPError as e:
            self.errors[i] = type(e).__name__
        self.started[i].set()

    def wait_started(self) -> None:
        assert all(e.wait(300) for e in self.started)

    def join(self, timeout_s: float) -> None:
        for t in self.threads:
            t.join(timeout_s)
        assert not any(t.is_alive() for t in self.threads), "a stream hung"


@pytest.mark.parametrize("role", ["worker", "scheduler", "tokenizer"])
def test_sigkill_of_a_child_under_load(role: str, model_dir: Path, tmp_path: Path) -> None:
    s = start_server(model_dir, tmp_path, "--max-total-tokens", "8192", timeout_s=600)
    try:
        pids, ipc_dir = _pids(s)
        assert set(pids) == {"worker", "scheduler", "tokenizer"} and ipc_dir.is_dir()
        streams = Streams(s, 3, BODY)
        streams.wait_started()
        os.kill(pids[role], signal.SIGKILL)
        t0 = time.monotonic()
        code = s.proc.wait(timeout=30)
        exit_s = time.monotonic() - t0
        streams.join(30)
    finally:
        s.stop()
    assert code != 0
    print(f"launcher exited {exit_s:.2f} s after the SIGKILL of the {role}")
    for lines, err in zip(streams.lines, streams.errors, strict=True):
        if role == "tokenizer":  # the process that held the connections is gone: EOF, not a hang
            assert err is not None or lines[-1] != "data: [DONE]"
        else:
            assert err is None and lines[-1] == "data: [DONE]", (lines[-3:], err)
            event = orjson.loads(lines[-2].removeprefix("data: "))
            want = f"server is shutting down: the {role} process exited unexpectedly"
            assert event["error"] == {"message": want, "type": "service_unavailable", "param": None,
                                      "code": None}, event
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in pids.values())
    assert not ipc_dir.exists()


def test_health_then_sigterm_drains(model_dir: Path, tmp_path: Path) -> None:
    # a stopped scheduler is reported after --control-timeout (4 s instead of the default 10)
    s = start_server(model_dir, tmp_path, "--max-total-tokens", "8192", "--graceful-shutdown-timeout", "120",
                     "--control-timeout", "4", timeout_s=600)
    try:
        pids, ipc_dir = _pids(s)
        os.kill(pids["scheduler"], signal.SIGSTOP)  # alive, not answering
        try:
            assert httpx.get(s.base_url + "/health", timeout=60).status_code == 503
        finally:
            os.kill(pids["scheduler"], signal.SIGCONT)
        assert httpx.get(s.base_url + "/health", timeout=60).status_code == 200
        streams = Streams(s, 2, {**BODY, "max_tokens": 24})
        streams.wait_started()
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        r = httpx.post(s.base_url + "/v1/completions", json={**BODY, "stream": False}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
        assert httpx.get(s.base_url + "/health", timeout=30).status_code == 503
        streams.join(300)
        code = s.proc.wait(timeout=60)
    finally:
        s.stop()
    assert code == 0
    for lines, err in zip(streams.lines, streams.errors, strict=True):  # in-flight streams finished
        assert err is None and lines[-1] == "data: [DONE]", (lines[-3:], err)
        finals = [orjson.loads(x.removeprefix("data: ")) for x in lines[:-1]]
        assert finals[-1]["choices"][0]["finish_reason"] == "length", finals[-1]
    assert not any(pid_alive(p) for p in pids.values()) and not ipc_dir.exists()
