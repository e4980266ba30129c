"""The tokenizer process as the launcher runs it: `python -m radixrt.child tokenizer`, Ready, SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import zmq

from radixrt import protocol
from radixrt.config import ServerArgs
from radixrt.ipc import IpcAddresses, Receiver

from .fakes import FakeScheduler, free_port, wait_for


def _spawn(args: ServerArgs, addrs: IpcAddresses, model_dir: Path, log: Path) -> subprocess.Popen:
    spec = {"args": args.to_dict(), "addrs": addrs.to_dict(), "model_dir": str(model_dir),
            "extra": {"worker_info": {"context_length": 1024}}}
    proc = subprocess.Popen([sys.executable, "-m", "radixrt.child", "tokenizer"], stdin=subprocess.PIPE,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    assert proc.stdin is not None
    proc.stdin.write(orjson.dumps(spec))
    proc.stdin.close()
    return proc


def test_ready_after_listening_then_clean_sigterm(tok_model_dir: Path, tmp_path: Path) -> None:
    addrs = IpcAddresses.create()
    ctx = zmq.Context()
    launcher = Receiver(ctx, addrs.launcher_in, protocol.CHILD_TO_LAUNCHER)
    sched = FakeScheduler(addrs, lambda req: ([42, 43], "stop")).start()
    args = ServerArgs(port=free_port())
    proc = _spawn(args, addrs, tok_model_dir, tmp_path / "tok.log")
    try:
        msg = launcher.recv(timeout_ms=60_000)
        assert isinstance(msg, protocol.Ready), (tmp_path / "tok.log").read_text()
        assert msg.process == "tokenizer" and msg.pid == proc.pid and msg.protocol_version >= 1
        base = f"http://127.0.0.1:{args.port}"
        assert httpx.get(base + "/health", timeout=10).status_code == 200  # listening when Ready
        r = httpx.post(base + "/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": "hi"})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, (tmp_path / "tok.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sched.stop()
        launcher.sock.close()
        ctx.term()
        addrs.cleanup()


def test_port_in_use_is_a_fatal_start_up_error(tok_model_dir: Path, tmp_path: Path) -> None:
    import socket

    addrs = IpcAddresses.create()
    ctx = zmq.Context()
    launcher = Receiver(ctx, addrs.launcher_in, protocol.CHILD_TO_LAUNCHER)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    args = ServerArgs(port=busy.getsockname()[1])
    proc = _spawn(args, addrs, tok_model_dir, tmp_path / "tok.log")
    try:
        msg: Any = launcher.recv(timeout_ms=60_000)
        assert isinstance(msg, protocol.Fatal) and str(args.port) in msg.message
        assert proc.wait(timeout=20) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        busy.close()
        launcher.sock.close()
        ctx.term()
        addrs.cleanup()


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "sibling-died"])
def test_sigterm_ends_in_flight_requests_with_an_error(tok_model_dir: Path, tmp_path: Path,
                                                       crash: bool) -> None:
    """Shutdown: a stream in flight gets an SSE error event and [DONE]; a non-streamed request a 503.
    After a sibling died (the launcher leaves its reason in the ipc directory, then sends SIGINT) the
    message names it."""
    import threading
    import time

    addrs = IpcAddresses.create()
    ctx = zmq.Context()
    launcher = Receiver(ctx, addrs.launcher_in, protocol.CHILD_TO_LAUNCHER)
    sched = FakeScheduler(addrs, lambda req: ([42, 43], None)).start()  # never finishes on its own
    args = ServerArgs(port=free_port())
    proc = _spawn(args, addrs, tok_model_dir, tmp_path / "tok.log")
    base = f"http://127.0.0.1:{args.port}"
    body = {"model": "SmolLM2-135M-Instruct", "prompt": "hi", "max_tokens": 100}
    lines: list[str] = []
    plain: list[httpx.Response] = []
    streaming = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", base + "/v1/completions", json={**body, "stream": True}, timeout=30) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    streaming.set()

    threads = [threading.Thread(target=stream), threading.Thread(
        target=lambda: plain.append(httpx.post(base + "/v1/completions", json=body, timeout=30)))]
    try:
        ready = launcher.recv(timeout_ms=60_000)
        assert isinstance(ready, protocol.Ready), (tmp_path / "tok.log").read_text()
        for t in threads:
            t.start()
        assert streaming.wait(20) and wait_for(lambda: len(sched.received) == 2, 20)
        t0 = time.monotonic()
        if crash:
            addrs.write_stop_reason("the scheduler process exited unexpectedly")
        proc.send_signal(signal.SIGINT if crash else signal.SIGTERM)
        want = "server is shutting down" + (": the scheduler process exited unexpectedly" if crash else "")
        for t in threads:
            t.join(20)
        assert proc.wait(timeout=20) == 0, (tmp_path / "tok.log").read_text()
        assert time.monotonic() - t0 < 4  # no waiting out the graceful-shutdown period
        assert lines[-1] == "data: [DONE]", lines
        err = orjson.loads(lines[-2].removeprefix("data: "))["error"]
        assert err["message"] == want and err["type"] == "service_unavailable", err
        assert plain[0].status_code == 503
        assert plain[0].json()["error"]["message"] == want
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sched.stop()
        launcher.sock.close()
        ctx.term()
        addrs.cleanup()
