"""`radixrt launch-server`: start the three processes, wait for their handshakes, own shutdown.

Start order: all three at once. The worker's Ready carries the KV pool size and model facts that
the scheduler and the tokenizer process size themselves from; they import their modules and load
their tokenizers while the worker loads the model, then wait for those facts, which the launcher
writes to their stdin (radixrt/child.py) once every worker rank is Ready. Each child reports
`protocol.Ready` (with PROTOCOL_VERSION) or `protocol.Fatal` on the launcher's channel. With
--tp-size N the worker is N processes ("worker0".."worker<N-1>", docs/tensor_parallel.md), all
started at once; every rank's Ready is awaited and they must agree on the pool; rank 0's facts are
passed on. Any of them dying is a dead child like any other.

Shutdown (docs/reliability.md lists what each path guarantees):
- SIGTERM: graceful. The tokenizer process alone is told first (SIGTERM): it answers new requests
  with 503 and lets in-flight ones finish for up to --graceful-shutdown-timeout, then ends the rest
  with an error and exits; then the scheduler and the worker are stopped. Exit 0.
- SIGINT (Ctrl-C): the same without the drain.
- A child that dies (or reports Fatal): the tokenizer gets SIGINT (every open stream ends with an
  SSE error event at once), the others SIGTERM, SIGKILL after CRASH_STOP_GRACE_S; exit 1, within
  5 s of the death.
Children run in their own session (the terminal's Ctrl-C reaches only the launcher) and die with it
(PR_SET_PDEATHSIG); the private ipc directory is removed on every path out.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import zmq

from radixrt.config import PROTOCOL_VERSION, Env, ServerArgs, worker_env
from radixrt.ipc import IpcAddresses, Receiver, worker_name
from radixrt.protocol import CHILD_TO_LAUNCHER, Fatal, Ready

log = logging.getLogger("radixrt.launcher")

READY_TIMEOUT_S = 900.0
STOP_GRACE_S = 5.0  # after SIGTERM, a child gets this long before SIGKILL
CRASH_STOP_GRACE_S = 3.0  # the same after a child died (the launcher must be gone within 5 s)
POLL_S = 0.1
FRONT_ROLES = ("scheduler", "tokenizer")  # the children that wait for the worker's facts


class LaunchError(RuntimeError):
    """A child failed; the message is one line for the user, `exit_code` the server's exit status,
    `reason` (when a serving child died) the shorter line that clients with requests in flight get."""

    def __init__(self, message: str, exit_code: int = 1, reason: str | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.reason = reason


class _Stop(Exception):
    """Raised from the signal handler to leave the wait loops; `signum` is the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Launcher:
    """Owns the child processes and the ipc directory for the server's lifetime."""

    def __init__(self, args: ServerArgs, model_dir: Path) -> None:
        self.args = args
        self.model_dir = model_dir
        self.addrs = IpcAddresses.create()
        self.ctx = zmq.Context()
        self.rx = Receiver(self.ctx, self.addrs.launcher_in, CHILD_TO_LAUNCHER, bind=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.ready: set[str] = set()  # children that sent Ready (the tokenizer then serves HTTP)

    def spawn(self, role: str, extra: dict[str, Any], name: str | None = None,
              env: dict[str, str] | None = None, keep_stdin: bool = False) -> None:
        """Start child `role` (registered as `name`, default the role) with `extra` in its spec;
        env: its environment (default: the launcher's); keep_stdin: leave its stdin open for
        `send_worker_info` (else it is closed after the spec)."""
        spec = {"args": self.args.to_dict(), "addrs": self.addrs.to_dict(),
                "model_dir": str(self.model_dir), "extra": extra}
        proc = subprocess.Popen([sys.executable, "-m", "radixrt.child", role], stdin=subprocess.PIPE,
                                start_new_session=True, env=env)
        assert proc.stdin is not None
        proc.stdin.write(orjson.dumps(spec) + b"\n")
        if keep_stdin:
            proc.stdin.flush()
        else:
            proc.stdin.close()
        self.procs[name or role] = proc

    def send_worker_info(self, roles: tuple[str, ...], worker_info: dict[str, Any]) -> None:
        """Write the worker's facts as one JSON line to each role's stdin (spawned with keep_stdin),
        then close it. A child that already died is found by the next check_children."""
        line = orjson.dumps(worker_info) + b"\n"
        for role in roles:
            stdin = self.procs[role].stdin
            assert stdin is not None
            try:
                stdin.write(line)
                stdin.close()
            except BrokenPipeError:
                pass

    def start_all(self) -> dict[str, Any]:
        """Spawn the worker (one per tensor-parallel rank), the scheduler and the tokenizer process
        at once; wait for every worker Ready, pass rank 0's facts to the other two (they size
        themselves from them), wait for their Ready. Returns the worker facts.

        Raises:
            LaunchError: a child failed, or the ranks disagree on the KV pool or the vocab.
        """
        tp = self.args.tp_size
        names = [worker_name(r, tp) for r in range(tp)]
        env = worker_env(tp) if tp > 1 else None
        for rank, name in enumerate(names):
            self.spawn("worker", {"tp_rank": rank} if tp > 1 else {}, name, env)
        for role in FRONT_ROLES:
            self.spawn(role, {}, keep_stdin=True)
        worker_info = self.wait_workers(names)
        self.send_worker_info(FRONT_ROLES, worker_info)
        self.wait_ready(set(FRONT_ROLES))
        return worker_info

    def wait_workers(self, names: list[str]) -> dict[str, Any]:
        """Wait for the Ready of every worker rank in `names`; rank 0's facts (see start_all)."""
        infos = self.wait_ready(set(names))
        first = infos[names[0]]
        for name in names[1:]:
            for key in ("num_pages", "max_req_rows", "vocab_size", "context_length"):
                if infos[name].get(key) != first.get(key):
                    raise LaunchError(f"tensor-parallel ranks disagree on {key}: {names[0]} "
                                      f"{first.get(key)}, {name} {infos[name].get(key)}")
        return first

    def wait_ready(self, roles: set[str]) -> dict[str, dict]:
        """Block until every role in `roles` sent Ready; raise LaunchError on Fatal, death or timeout."""
        infos: dict[str, dict] = {}
        deadline = time.monotonic() + READY_TIMEOUT_S
        while roles - infos.keys():
            self.check_children()
            if time.monotonic() > deadline:
                raise LaunchError(f"timed out waiting for {sorted(roles - infos.keys())} to start")
            msg = self.rx.recv(timeout_ms=int(POLL_S * 1000))
            if isinstance(msg, Fatal):
                raise LaunchError(f"{msg.process} process failed to start: {msg.message}", msg.exit_code,
                                  reason=f"the {msg.process} process failed to start")
            if isinstance(msg, Ready):
                if msg.protocol_version != PROTOCOL_VERSION:
                    raise LaunchError(f"{msg.process} speaks protocol {msg.protocol_version}, "
                                      f"launcher {PROTOCOL_VERSION}")
                infos[msg.process] = msg.info
                self.ready.add(msg.process)
                log.info("%s process ready (pid %d)", msg.process, msg.pid)
        return infos

    def check_children(self) -> None:
        for role, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                raise LaunchError(f"{role} process exited unexpectedly with code {code}",
                                  reason=f"the {role} process exited unexpectedly")

    def monitor(self) -> None:
        """Return only by exception: LaunchError when a child dies, _Stop on a signal."""
        while True:
            self.check_children()
            msg = self.rx.recv(timeout_ms=int(POLL_S * 1000))
            if isinstance(msg, Fatal):
                raise LaunchError(f"{msg.process} process failed: {msg.message}",
                                  reason=f"the {msg.process} process failed")

    def drain(self) -> bool:
        """Graceful first step: SIGTERM the tokenizer process alone and wait until it has exited
        (its drain, --graceful-shutdown-timeout, plus STOP_GRACE_S); the scheduler and the worker
        keep serving meanwhile. Returns False if another child died during the drain (the tokenizer
        is then told to stop at once)."""
        tok = self.procs.get("tokenizer")
        if tok is None or tok.poll() is not None:
            return True
        tok.terminate()
        deadline = time.monotonic() + self.args.graceful_shutdown_timeout + STOP_GRACE_S
        healthy = True
        while tok.poll() is None and time.monotonic() < deadline:
            dead = [r for r, p in self.procs.items() if r != "tokenizer" and p.poll() is not None]
            if healthy and dead:
                healthy = False
                self.addrs.write_stop_reason(f"the {dead[0]} process exited unexpectedly")
                tok.send_signal(signal.SIGINT)
            time.sleep(POLL_S)
        return healthy

    def shutdown(self, crashed: bool = False) -> None:
        """Stop every live child (crashed: a serving tokenizer process with SIGINT, which ends its
        streams without a drain), SIGKILL after a grace period, remove the ipc directory. A child
        that has not sent Ready (a start that failed) gets SIGTERM, whose default action ends it
        while it still imports: it ignores SIGINT then (child.py), and ran out the grace period."""
        for role, proc in self.procs.items():
            if proc.poll() is None:
                serving = role == "tokenizer" and role in self.ready
                proc.send_signal(signal.SIGINT if crashed and serving else signal.SIGTERM)
        deadline = time.monotonic() + (CRASH_STOP_GRACE_S if crashed else STOP_GRACE_S)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.rx.sock.close()
        self.ctx.term()
        self.addrs.cleanup()


_stopping = False  # a stop signal was taken: later ones change nothing (launch_server resets it)


def _raise_stop(signum: int, frame: Any) -> None:
    """SIGINT / SIGTERM handler: raise _Stop once. A second signal (make forwards the SIGTERM sent
    to its process group, so the launcher gets two) arriving while the first is being handled
    returns instead of raising out of the shutdown path."""
    global _stopping
    if _stopping:
        return
    _stopping = True
    raise _Stop(signum)


def check_port_free(host: str, port: int) -> None:
    """Raises ValueError if (host, port) cannot be bound now (in use, or not a local address).
    The tokenizer process binds it for real later; this only makes a busy port fail fast."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            s.bind(addr)
        except OSError as e:
            raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def check_args_against_model(args: ServerArgs, model_dir: Path) -> None:
    """Flags that only the model or the machine can refute, checked before any process starts.

    Raises:
        ValueError: --device cuda without a CUDA device (or fewer than --tp-size); the triton
            attention backend without a CUDA device (unless TRITON_INTERPRET=1, the tests' Triton
            interpreter); --kv-cache-dtype fp8_e4m3 on another backend; --context-length above the
            model's limit; a --tp-size that does not divide the model, or > 1 with an FP8 checkpoint.
    """
    backend = args.resolved_attention_backend()
    if backend == "triton" and args.resolved_device() != "cuda" and not Env.read().triton_interpret:
        raise ValueError("--attention-backend triton needs a CUDA device (the device here is cpu; use sdpa "
                         "or torch)")
    if args.kv_cache_dtype == "fp8_e4m3" and backend != "triton":
        raise ValueError(f"--kv-cache-dtype fp8_e4m3 needs --attention-backend triton (here: {backend})")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available (torch sees none)")
        if torch.cuda.device_count() < args.tp_size:
            raise ValueError(f"--tp-size {args.tp_size}: only {torch.cuda.device_count()} CUDA devices")
    config = orjson.loads((model_dir / "config.json").read_bytes())
    if args.tp_size > 1:
        from radixrt.models.quant.qconfig import checkpoint_quantization
        from radixrt.models.resolve import read_model_config
        from radixrt.parallel.layout import check_divisible

        check_divisible(read_model_config(model_dir), args.tp_size)
        if checkpoint_quantization(config):  # FP8 weights (even dummy ones): the worker would refuse them
            raise ValueError(f"an FP8 checkpoint (quantization_config in {model_dir / 'config.json'}) with "
                             f"--tp-size {args.tp_size} is not supported yet")
    limit = config.get("max_position_embeddings")
    if args.context_length is not None and limit and args.context_length > int(limit):
        raise ValueError(f"--context-length {args.context_length} exceeds the model's "
                         f"max_position_embeddings ({limit})")


def launch_server(args: ServerArgs) -> int:
    """Run the server until a signal (exit 0) or a failure (exit 1; 2 for a bad model)."""
    from radixrt.models.resolve import ModelLoadError, resolve_model_dir

    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s launcher] %(message)s",
                        datefmt="%H:%M:%S")
    try:
        check_port_free(args.host, args.port)  # before the model is converted or loaded
        model_dir = resolve_model_dir(args.model_path, Env.read().cache_dir, args.load_format)
        check_args_against_model(args, model_dir)
    except (ModelLoadError, ValueError) as e:
        print(f"radixrt: error: {e}", file=sys.stderr)
        return 2
    if args.load_format == "dummy":  # said once, where an operator looks: the name is the model's
        log.warning("--load-format dummy: random weights under %s's name and config; the output is "
                    "noise (for benchmarks and tests)", args.model_path or "the default model")
    launcher = Launcher(args, model_dir)
    log.info("model dir %s, ipc dir %s", model_dir, launcher.addrs.dir)
    global _stopping
    _stopping = False
    old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    code, crashed = 0, False
    try:
        worker_info = launcher.start_all()
        log.info("radixrt serving %s on http://%s:%d (KV pool: %s tokens, %s GiB)", model_dir.name,
                 args.host, args.port, worker_info.get("pool_tokens"), worker_info.get("pool_gib"))
        print(f"radixrt: ready on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
        launcher.monitor()
    except _Stop as stop:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log.info("signal %d received, shutting down", stop.signum)
        if stop.signum == signal.SIGTERM and not launcher.drain():
            print("radixrt: error: a server process died during the graceful shutdown", file=sys.stderr)
            code = crashed = 1
    except LaunchError as e:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stop signal now must not skip the reason
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(f"radixrt: error: {e}", file=sys.stderr, flush=True)
        code, crashed = e.exit_code, True
        if e.reason:  # for the requests in flight, before the tokenizer process is told to stop
            launcher.addrs.write_stop_reason(e.reason)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        launcher.shutdown(crashed=bool(crashed))
        for s, h in old.items():
            signal.signal(s, h)
    return code
