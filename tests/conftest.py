"""Shared fixtures: the default model directory and real servers started as subprocesses."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from radixrt.config import Env


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests need CUDA: skip them where there is none (CI, laptops)."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The default SmolLM2-135M-Instruct, converted once to a safetensors model directory."""
    from radixrt.models.loader import resolve_model_dir

    return resolve_model_dir(None, Env.read().cache_dir, "auto")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(model_dir: Path, tmp_path: Path, *extra: str, env: dict | None = None,
                 timeout_s: float = 180.0) -> Server:
    """Launch `radixrt launch-server` on a free port and wait until /health answers 200."""
    port = free_port()
    log_path = tmp_path / f"server-{port}.log"
    cmd = [sys.executable, "-m", "radixrt.cli", "launch-server", "--model-path", str(model_dir),
           "--port", str(port), "--device", "cpu", *extra]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
    server = Server(proc, port, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()[-4000:]}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=5.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"server did not become healthy:\n{server.log()[-4000:]}")


@pytest.fixture(scope="session")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One shared server on the default model (page size 16, radix cache on, debug invariants)."""
    s = start_server(model_dir, tmp_path_factory.mktemp("server"), "--max-total-tokens", "32768",
                     env={"RADIXRT_DEBUG_INVARIANTS": "1"})
    yield s
    s.stop()
