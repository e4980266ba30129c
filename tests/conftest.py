"""Shared fixtures: the default model directory and real servers started as subprocesses."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run on the CPU interpreter; it must be set before any kernel is decorated,
    # whichever test module happens to import radixrt.kernels first.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from bench.server_proc import Server, start_server
from radixrt.config import Env

__all__ = ["Server", "start_server"]


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


@pytest.fixture(scope="session")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One shared server on the default model (page size 16, radix cache on, debug invariants)."""
    s = start_server(model_dir, tmp_path_factory.mktemp("server"), "--max-total-tokens", "32768",
                     env={"RADIXRT_DEBUG_INVARIANTS": "1"})
    yield s
    s.stop()
