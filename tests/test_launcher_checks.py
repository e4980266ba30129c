"""Flags the machine refutes are refused before any process starts (launcher.check_args_against_model),
with one `radixrt: error:` line and exit 2, instead of a server that reports ready and then fails
(break-it pass 4: the triton backend on a CPU-only machine crashed the worker at the first request; an
FP8 KV cache on the sdpa backend failed in the worker's start-up with a traceback)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from radixrt.config import ServerArgs
from radixrt.launcher import check_args_against_model


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_bytes(orjson.dumps({"max_position_embeddings": 8192}))
    return tmp_path


def test_triton_backend_without_cuda_is_refused(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="triton needs a CUDA device"):
        check_args_against_model(ServerArgs(device="cpu", attention_backend="triton"), model_dir)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the tests' Triton interpreter runs it on the CPU
    check_args_against_model(ServerArgs(device="cpu", attention_backend="triton"), model_dir)


def test_kv_cache_dtype_fp8_is_vllms_name_for_fp8_e4m3() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli_args(parser.parse_args(["--kv-cache-dtype", "fp8"]))
    assert args.kv_cache_dtype == "fp8_e4m3"
    assert ServerArgs(kv_cache_dtype="fp8").to_dict()["kv_cache_dtype"] == "fp8_e4m3"
    with pytest.raises(SystemExit):  # e5m2 pools are not served: argparse names the choices
        parser.parse_args(["--kv-cache-dtype", "fp8_e5m2"])


@pytest.mark.parametrize("backend", ["auto", "sdpa", "torch"])
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8"])
def test_fp8_kv_cache_needs_the_triton_backend(model_dir: Path, backend: str, kv_dtype: str) -> None:
    args = ServerArgs(device="cpu", attention_backend=backend, kv_cache_dtype=kv_dtype)
    with pytest.raises(ValueError, match="fp8_e4m3 needs --attention-backend triton"):
        check_args_against_model(args, model_dir)
    check_args_against_model(ServerArgs(device="cpu", attention_backend=backend), model_dir)


def test_stop_signal_handler_raises_once(monkeypatch):
    """make forwards the SIGTERM sent to its process group, so the launcher can take two: the second,
    arriving while the first is being handled, must not raise out of the shutdown path."""
    import signal

    from radixrt import launcher

    monkeypatch.setattr(launcher, "_stopping", False)
    with pytest.raises(launcher._Stop) as first:
        launcher._raise_stop(signal.SIGTERM, None)
    assert first.value.args == (signal.SIGTERM,)
    assert launcher._raise_stop(signal.SIGTERM, None) is None
    assert launcher._raise_stop(signal.SIGINT, None) is None


def test_context_length_the_pool_cannot_hold_is_refused() -> None:
    """The worker caps the context at the pool less one page; a --context-length above that, or a
    pool whose context would be under 2 tokens, is a flag error (exit 2 from the CLI), not a server
    that silently serves a shorter context (or, at 1 token, refuses every request)."""
    from radixrt.config import ServerArgs

    ServerArgs(context_length=48, max_total_tokens=64, page_size=16)  # 4 pages: 3 for the context
    ServerArgs(context_length=2, max_total_tokens=3, page_size=1)
    with pytest.raises(ValueError, match="--context-length 64 exceeds .* 48 tokens"):
        ServerArgs(context_length=64, max_total_tokens=64, page_size=16)
    with pytest.raises(ValueError, match="leaves a context of 1 token"):
        ServerArgs(max_total_tokens=2, page_size=1)


def test_fp8_checkpoint_with_tensor_parallelism_is_refused_before_any_child(tmp_path: Path) -> None:
    """An FP8 checkpoint (detected from quantization_config, no --quantization flag) with --tp-size 2:
    refused here, naming the checkpoint; before, the workers refused it after every child had started,
    blaming a "--quantization fp8" the user never gave."""
    from tests.models.tiny import BASE

    cfg = {**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (tmp_path / "config.json").write_bytes(orjson.dumps(cfg))
    with pytest.raises(ValueError, match="an FP8 checkpoint .* with --tp-size 2 is not supported"):
        check_args_against_model(ServerArgs(device="cpu", tp_size=2), tmp_path)
    del cfg["quantization_config"]
    (tmp_path / "config.json").write_bytes(orjson.dumps(cfg))
    check_args_against_model(ServerArgs(device="cpu", tp_size=2), tmp_path)


def test_the_launcher_imports_neither_torch_nor_the_grammar_stack() -> None:
    """The launcher resolves the model and checks flags before any child starts; torch (seconds on a
    cold start) is imported only where a flag needs the device (`resolved_device`). A tool-parser
    import pulled it, and xgrammar, into every start through radixrt.config (session of 2026-12-04)."""
    import subprocess
    import sys

    code = ("import sys, radixrt.launcher, radixrt.cli; "
            "print(sorted(m for m in ('torch', 'xgrammar', 'radixrt.constrained') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("ready", [False, True], ids=["starting", "serving"])
def test_crash_stop_signals_a_tokenizer_by_whether_it_serves(tmp_path: Path, ready: bool) -> None:
    """After a sibling failed: a tokenizer process still starting gets SIGTERM (its default action
    ends it while it imports; it ignores SIGINT then, and used to run out the 3 s grace period before
    a SIGKILL), a serving one SIGINT (it ends its streams without a drain)."""
    import signal
    import subprocess
    import sys

    from radixrt.launcher import Launcher

    launcher = Launcher(ServerArgs(device="cpu"), tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE)
    launcher.procs["tokenizer"] = child
    if ready:
        launcher.ready.add("tokenizer")
    launcher.shutdown(crashed=True)
    assert child.returncode == -(signal.SIGINT if ready else signal.SIGTERM)


def test_a_dead_sibling_leaves_its_reason_for_the_requests_in_flight(tmp_path: Path) -> None:
    """A child that exited is a LaunchError whose `reason` names it for clients; during a graceful
    drain the launcher leaves that reason in the ipc directory before it SIGINTs the tokenizer
    process, which ends its requests with "server is shutting down: <reason>"
    (tests/tokenizer_proc/test_process.py)."""
    import subprocess
    import sys

    from radixrt.launcher import Launcher, LaunchError

    launcher = Launcher(ServerArgs(device="cpu", graceful_shutdown_timeout=30), tmp_path)
    try:
        dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        dead.wait()
        launcher.procs["scheduler"] = dead
        with pytest.raises(LaunchError, match="scheduler process exited unexpectedly with code 3") as e:
            launcher.check_children()
        assert e.value.reason == "the scheduler process exited unexpectedly"
        assert launcher.addrs.read_stop_reason() is None  # nothing left before the launcher writes it
        # a stand-in tokenizer process: ignores SIGTERM (it would drain), and on SIGINT exits 7 if the
        # reason was already there when the signal came (the order the real one relies on), else 8
        tok = subprocess.Popen([sys.executable, "-c", """if True:
            import os, signal, sys, time
            from radixrt.ipc import IpcAddresses
            addrs = IpcAddresses(dir=sys.argv[1], scheduler_in="", tokenizer_in="", worker_in="",
                                 scheduler_results="", launcher_in="")
            want = "the scheduler process exited unexpectedly"
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, lambda *a: os._exit(7 if addrs.read_stop_reason() == want else 8))
            print("up", flush=True)
            time.sleep(60)""", launcher.addrs.dir], stdout=subprocess.PIPE)
        assert tok.stdout is not None and tok.stdout.readline() == b"up\n"  # the handlers are in place
        launcher.procs["tokenizer"] = tok
        assert launcher.drain() is False  # the drain saw the dead scheduler and SIGINTed the tokenizer
        assert tok.wait(timeout=10) == 7, "the reason was not there when the tokenizer process was told"
    finally:
        launcher.shutdown(crashed=True)


@pytest.mark.parametrize("during_start", [True, False], ids=["start-up", "serving"])
def test_a_fatal_report_carries_a_reason_for_clients(tmp_path: Path, during_start: bool) -> None:
    """A child's Fatal message, during start-up (the tokenizer process may already serve HTTP then)
    or while serving, is a LaunchError whose `reason` names the process for the requests in flight."""
    import zmq

    from radixrt import protocol
    from radixrt.ipc import Sender
    from radixrt.launcher import Launcher, LaunchError

    launcher = Launcher(ServerArgs(device="cpu"), tmp_path)
    ctx = zmq.Context()
    tx = Sender(ctx, launcher.addrs.launcher_in)
    try:
        tx.send(protocol.Fatal(process="worker", message="CUDA error: out of memory", exit_code=3))
        with pytest.raises(LaunchError, match="worker process failed.*out of memory") as e:
            launcher.wait_ready({"worker"}) if during_start else launcher.monitor()
        want = "the worker process failed to start" if during_start else "the worker process failed"
        assert e.value.reason == want and e.value.exit_code == (3 if during_start else 1)
    finally:
        tx.sock.close()
        ctx.term()
        launcher.shutdown(crashed=True)


def test_python_dash_m_radixrt_runs_the_cli() -> None:
    """`python -m radixrt launch-server --help` works as the `radixrt` script does (it was "No module
    named radixrt.__main__"; break-it, 2026-12-05)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "radixrt", "launch-server", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--trust-request-chat-template" in r.stdout and "--model-path" in r.stdout
