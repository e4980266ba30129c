"""The worker process over real ZeroMQ sockets: Ready handshake, a forward pass, shutdown; Fatal on
a bad model. Spawned the way the launcher does it (`python -m radixrt.child worker`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import zmq

from radixrt import protocol
from radixrt.config import PROTOCOL_VERSION, ServerArgs
from radixrt.ipc import IpcAddresses, Receiver, Sender
from tests.models.tiny import BASE, write_config

I32 = np.int32


def _spawn(args: ServerArgs, addrs: IpcAddresses, model_dir: Path) -> subprocess.Popen:
    spec = {"args": args.to_dict(), "addrs": addrs.to_dict(), "model_dir": str(model_dir), "extra": {}}
    proc = subprocess.Popen([sys.executable, "-m", "radixrt.child", "worker"], stdin=subprocess.PIPE)
    proc.stdin.write(orjson.dumps(spec))
    proc.stdin.close()
    return proc


def _batch() -> protocol.ForwardBatch:
    return protocol.ForwardBatch(
        batch_id=7, mode=int(protocol.ForwardMode.EXTEND), req_rows=np.array([0, 1], I32),
        input_ids=np.array([5, 6, 7, 8, 9], I32), positions=np.array([0, 1, 2, 0, 1], I32),
        out_cache_loc=np.array([16, 17, 18, 32, 33], I32), seq_lens=np.array([3, 2], I32),
        extend_lens=np.array([3, 2], I32), upd_rows=np.array([0, 1], I32), upd_cols=np.array([0, 0], I32),
        upd_pages=np.array([1, 2], I32), temperature=np.array([0.0, 1.0], np.float32),
        top_p=np.ones(2, np.float32), top_k=np.full(2, -1, I32), min_p=np.zeros(2, np.float32),
        seeds=np.array([1, 2], I32), sample_steps=np.zeros(2, I32), return_logprob=True, top_logprobs_num=3)


def test_worker_round_trip(tmp_path: Path) -> None:
    model_dir = write_config(tmp_path / "m", architectures=["LlamaForCausalLM"], model_type="llama", **BASE)
    args = ServerArgs(device="cpu", load_format="dummy", max_total_tokens=256, max_running_requests=4)
    addrs = IpcAddresses.create()
    ctx = zmq.Context()
    try:
        launcher = Receiver(ctx, addrs.launcher_in, protocol.CHILD_TO_LAUNCHER)
        results = Receiver(ctx, addrs.scheduler_results, protocol.WORKER_TO_SCHEDULER)
        proc = _spawn(args, addrs, model_dir)
        ready = launcher.recv(timeout_ms=60_000)
        assert isinstance(ready, protocol.Ready), ready
        assert ready.process == "worker" and ready.protocol_version == PROTOCOL_VERSION
        info = ready.info
        assert info["page_size"] == 16 and info["num_pages"] == 256 // 16 + 1
        assert info["vocab_size"] == BASE["vocab_size"] and info["max_req_rows"] == 4
        # a request must fit in the pool on its own, with a page to spare for a copy-on-write page:
        # the context length is capped at the pool size less one page
        assert info["pool_tokens"] == 256 and info["context_length"] == 256 - 16
        assert info["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # K+V, layers, kv heads, head_dim, fp32
        to_worker = Sender(ctx, addrs.worker_in)
        to_worker.send(_batch())
        res = results.recv(timeout_ms=60_000)
        assert isinstance(res, protocol.ForwardResult) and res.batch_id == 7
        assert res.next_token_ids.shape == (2,) and res.next_token_ids.dtype == I32
        assert ((0 <= res.next_token_ids) & (res.next_token_ids < BASE["vocab_size"])).all()
        assert res.logprobs.shape == (2,) and res.top_logprob_ids.shape == (6,)
        assert res.next_token_ids[0] == res.top_logprob_ids[0]  # greedy row: its top-1
        to_worker.send(protocol.WorkerControl("shutdown"))
        assert proc.wait(timeout=30) == 0
    finally:
        ctx.destroy(linger=0)
        addrs.cleanup()


def test_worker_reports_fatal(tmp_path: Path) -> None:
    args = ServerArgs(device="cpu", max_total_tokens=256)
    addrs = IpcAddresses.create()
    ctx = zmq.Context()
    try:
        launcher = Receiver(ctx, addrs.launcher_in, protocol.CHILD_TO_LAUNCHER)
        proc = _spawn(args, addrs, tmp_path / "missing")
        msg = launcher.recv(timeout_ms=60_000)
        assert isinstance(msg, protocol.Fatal) and msg.process == "worker"
        assert "config.json" in msg.message and "\n" not in msg.message
        assert proc.wait(timeout=30) == 2
    finally:
        ctx.destroy(linger=0)
        addrs.cleanup()


def test_cpu_threads_default_env_and_errors(monkeypatch) -> None:
    """All the cores we may run on (shared by TP ranks), RADIXRT_CPU_THREADS when set, a clear error
    for a bad value."""
    import os

    import pytest

    from radixrt.worker.worker_proc import cpu_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.delenv("RADIXRT_CPU_THREADS", raising=False)
    assert (cpu_threads(), cpu_threads(2), cpu_threads(4), cpu_threads(8)) == (6, 3, 1, 1)
    monkeypatch.setenv("RADIXRT_CPU_THREADS", "2")
    assert cpu_threads() == 2
    for bad in ("0", "two"):
        monkeypatch.setenv("RADIXRT_CPU_THREADS", bad)
        with pytest.raises(ValueError):
            cpu_threads()


def test_model_load_error_is_one_line_without_traceback(tmp_path: Path) -> None:
    """A model the worker cannot load (here a vocab_size that disagrees with the embedding) is the
    user's input error: Fatal, exit 2, and one log line, no traceback (before: a full traceback on
    the server's stderr under the launcher's one-line error)."""
    from tests.models.tiny import save_tiny_model

    save_tiny_model("llama", tmp_path)
    (tmp_path / "config.json").write_text(
        (tmp_path / "config.json").read_text().replace('"vocab_size": 300', '"vocab_size": 200'))
    args = ServerArgs(device="cpu", max_total_tokens=256)
    addrs = IpcAddresses.create()
    ctx = zmq.Context()
    try:
        launcher = Receiver(ctx, addrs.launcher_in, protocol.CHILD_TO_LAUNCHER)
        spec = {"args": args.to_dict(), "addrs": addrs.to_dict(), "model_dir": str(tmp_path), "extra": {}}
        proc = subprocess.Popen([sys.executable, "-m", "radixrt.child", "worker"], stdin=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        proc.stdin.write(orjson.dumps(spec).decode())
        proc.stdin.close()
        msg = launcher.recv(timeout_ms=60_000)
        assert isinstance(msg, protocol.Fatal) and "(300, 64) != expected (200, 64)" in msg.message
        assert proc.wait(timeout=30) == 2
        err = proc.stderr.read()
        assert "Traceback" not in err and "embed_tokens" in err, err
    finally:
        ctx.destroy(linger=0)
        addrs.cleanup()


def test_sigint_while_a_child_imports_ends_it_quietly() -> None:
    """The launcher SIGINTs the tokenizer process when a sibling fails at start-up, often while it is
    still importing; it must end without a KeyboardInterrupt traceback (seen under every worker-side
    ModelLoadError before)."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "radixrt.child", "tokenizer"], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # the interpreter is up; child.py is importing its modules (seconds on CPU)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_a_pool_too_small_for_any_request_refuses_to_start(tmp_path: Path) -> None:
    """--page-size larger than the KV pool left a context length of 0: the server started, answered
    every request 400 and /v1/models 500 (break-it, 2026-12-05). Now the worker refuses to start:
    Fatal, one line, exit 2."""
    model_dir = write_config(tmp_path / "m", architectures=["LlamaForCausalLM"], model_type="llama", **BASE)
    args = ServerArgs(device="cpu", load_format="dummy", page_size=100_000)
    addrs = IpcAddresses.create()
    ctx = zmq.Context()
    try:
        launcher = Receiver(ctx, addrs.launcher_in, protocol.CHILD_TO_LAUNCHER)
        proc = _spawn(args, addrs, model_dir)
        msg = launcher.recv(timeout_ms=60_000)
        assert isinstance(msg, protocol.Fatal) and "too small for any request" in msg.message, msg
        assert "--page-size" in msg.message and "\n" not in msg.message
        assert proc.wait(timeout=30) == 2
    finally:
        ctx.destroy(linger=0)
        addrs.cleanup()
