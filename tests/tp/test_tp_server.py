"""A server with --tp-size 2 on CPU (two gloo worker ranks): it answers the official openai client,
its greedy tokens are those of the unsharded model, and the SIGKILL of one rank stops the whole
server (non-zero exit within 5 s, no child left, ipc directory removed). One module server; the
fault test ends it and runs last."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch

from bench.dummy_tokenizer import make_dummy_model_dir
from bench.server_proc import Server, pid_alive, start_server
from tests.tp.tp_ranks import CONFIG_DIR, MAX_NEW, PROMPTS, compute


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dummy_model_dir(CONFIG_DIR, tmp_path_factory.mktemp("tiny-tp"))


@pytest.fixture(scope="module")
def tp_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(model_dir, tmp_path_factory.mktemp("tp-server"), "--tp-size", "2", "--load-format",
                     "dummy", "--random-seed", "3", "--page-size", "4", "--max-total-tokens", "512",
                     "--max-running-requests", "4", "--cpu-threads", "1", timeout_s=300)
    yield s
    s.stop()


def test_openai_client_chat(tp_server: Server) -> None:
    client = openai.OpenAI(base_url=tp_server.base_url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
    assert r.choices[0].message.content
    info = httpx.get(tp_server.base_url + "/get_server_info", timeout=30).json()
    assert info["worker"]["tp_size"] == 2


def test_greedy_tokens_match_tp1(tp_server: Server, model_dir: Path) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = compute(model_dir, "dummy")["tokens"]
    finally:
        torch.set_num_threads(before)
    r = httpx.post(tp_server.base_url + "/generate", timeout=120, json={
        "input_ids": PROMPTS, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW,
                                                  "ignore_eos": True}})
    assert r.status_code == 200, r.text
    assert [c["output_ids"] for c in r.json()] == want


def test_sigkill_of_one_rank_stops_the_server(tp_server: Server) -> None:
    log = tp_server.log()
    pids = {m.group(1): int(m.group(2)) for m in re.finditer(r"(\w+) process ready \(pid (\d+)\)", log)}
    ipc_dir = Path(re.search(r"ipc dir (\S+)", log).group(1))
    assert set(pids) == {"worker0", "worker1", "scheduler", "tokenizer"} and ipc_dir.is_dir()
    os.kill(pids["worker1"], signal.SIGKILL)
    t0 = time.monotonic()
    code = tp_server.proc.wait(timeout=30)
    exit_s = time.monotonic() - t0
    assert code != 0
    print(f"launcher exited {exit_s:.2f} s after the SIGKILL of worker1")  # bound: CRASH_STOP_GRACE_S
    assert not any(pid_alive(p) for p in pids.values())  # the launcher waited for every child
    assert not ipc_dir.exists()
