"""Shared fixtures: the default model directory and real servers started as subprocesses."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run on the CPU interpreter; it must be set before any kernel is decorated,
    # whichever test module happens to import radixrt.kernels first.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # In-process Engines get the worker process's thread rule (cores - 1, at least 1): the tests run
    # beside the session server's worker, and two torch threads on a 2-core machine that also runs a
    # worker made an Engine test 2x slower (42 s vs 21 s against one busy core, 2026-12-01).
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    # Servers started by the tests likewise run their worker on cores - 1 threads (the product's
    # default is all cores, worker_proc.cpu_threads): two pytest workers share the machine, and
    # spinning OpenMP threads that lose their core stall every parallel region.
    os.environ.setdefault("RADIXRT_CPU_THREADS", str(max(1, (os.cpu_count() or 2) - 1)))
    # servers started by tests leave their KV pools untouched while idle (the two pytest workers share
    # the cores); tests/worker/test_kv_prefault.py covers the prefault itself
    os.environ.setdefault("RADIXRT_KV_PREFAULT", "0")


def _patch_interpreter_scalar_index() -> None:
    """Triton 3.6's interpreter turns a scalar tensor into an int with int(array_of_shape_(1,)), which
    numpy >= 2.4 rejects; kernels use loaded scalars as loop bounds (range(0, prefix_len, BLOCK_N)).
    Convert through .item() instead. Test-only; compiled kernels are unaffected."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_radixrt_patched", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0].item()))

    patched._radixrt_patched = True
    interpreter._patch_lang_tensor = patched


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_interpreter_scalar_index()

from bench.server_proc import Server, pid_alive, start_server  # noqa: E402
from radixrt.config import Env  # noqa: E402

__all__ = ["KEYED_API_KEY", "KEYED_BODY_LIMIT", "Server", "start_server"]

KEYED_API_KEY = "sk-reliability-8f3e1c9a2b7d"
KEYED_BODY_LIMIT = 65536  # bytes, --max-request-body-bytes of `keyed_server`


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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadfile` (make test): whole files per worker, and one unit for all the files that use
    a session server, so that each server starts once (tests/xdist_scheduling.py). Other modes: xdist's."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.xdist_scheduling import SessionServerScheduling

    return SessionServerScheduling(config, log)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The default SmolLM2-135M-Instruct, converted once to a safetensors model directory."""
    from radixrt.models.loader import resolve_model_dir

    return resolve_model_dir(None, Env.read().cache_dir, "auto")


@pytest.fixture(scope="session")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One shared server on the default model (page size 16, radix cache on, debug invariants)."""
    s = start_server(model_dir, tmp_path_factory.mktemp("server"), "--max-total-tokens", "32768",
                     env={"RADIXRT_DEBUG_INVARIANTS": "1"})
    yield s
    stop_cleanly(s)


def stop_cleanly(s: Server) -> None:
    """SIGTERM `s` (idle); assert the launcher exits 0 (within Server.stop's 20 s) and that none of
    its children is alive 0.5 s later. Raises AssertionError (a teardown error) otherwise."""
    pids = [int(p) for p in re.findall(r"process ready \(pid (\d+)\)", s.log())]
    assert pids, s.log()[-2000:]
    assert s.stop() == 0, s.log()[-2000:]
    time.sleep(0.5)
    assert not any(pid_alive(p) for p in pids), s.log()[-2000:]


@pytest.fixture(scope="session")
def keyed_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server with an API key (KEYED_API_KEY), a 6 s --request-timeout and a KEYED_BODY_LIMIT body
    limit (debug invariants on), shared by the API-key conformance tests and the hostile-input tests
    (one start instead of two)."""
    s = start_server(model_dir, tmp_path_factory.mktemp("keyed"), "--api-key", KEYED_API_KEY,
                     "--request-timeout", "6", "--max-total-tokens", "16384",
                     "--max-request-body-bytes", str(KEYED_BODY_LIMIT), env={"RADIXRT_DEBUG_INVARIANTS": "1"})
    yield s
    stop_cleanly(s)
