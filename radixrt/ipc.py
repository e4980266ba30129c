"""ZeroMQ PUSH/PULL channels over ipc:// sockets in a private 0700 directory.

The launcher creates the directory and names one address per channel (`IpcAddresses`); each
process binds the channel it receives on and connects the ones it sends on. Messages are encoded
by `radixrt.protocol` (orjson header + raw array frames; never pickle).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

import zmq

from radixrt import protocol

STOP_REASON_FILE = "stop_reason"  # IpcAddresses.write_stop_reason / read_stop_reason


@dataclass(frozen=True, slots=True)
class IpcAddresses:
    """One ipc:// endpoint per channel, named after its receiver."""

    dir: str
    scheduler_in: str  # tokenizer -> scheduler
    tokenizer_in: str  # scheduler -> tokenizer
    worker_in: str  # scheduler -> worker
    scheduler_results: str  # worker -> scheduler
    launcher_in: str  # every child -> launcher (Ready / Fatal)

    @classmethod
    def create(cls) -> IpcAddresses:
        """Make a fresh private (0700) directory `radixrt-<launcher pid>-*`; the caller removes it
        with `cleanup`. Directories left by launchers that were killed (SIGKILL skips cleanup) are
        removed here, next time a server starts."""
        remove_stale_dirs()
        d = tempfile.mkdtemp(prefix=f"radixrt-{os.getpid()}-")
        os.chmod(d, 0o700)
        return cls(dir=d, **{name: f"ipc://{d}/{name}" for name in
                             ("scheduler_in", "tokenizer_in", "worker_in", "scheduler_results",
                              "launcher_in")})

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def write_stop_reason(self, reason: str) -> None:
        """Leave `reason` (one line for clients, e.g. "the scheduler process exited unexpectedly") in
        the directory before the launcher stops a serving tokenizer process after a crash; that
        process ends its in-flight requests with it (`read_stop_reason`). Best effort: an unwritable
        directory leaves the plain "server is shutting down"."""
        try:
            with open(os.path.join(self.dir, STOP_REASON_FILE), "w") as f:
                f.write(reason)
        except OSError:
            pass

    def read_stop_reason(self) -> str | None:
        """The reason `write_stop_reason` left, or None (a graceful stop, or a signal from outside)."""
        try:
            with open(os.path.join(self.dir, STOP_REASON_FILE)) as f:
                return f.read().strip() or None
        except OSError:
            return None

    def worker_in_for(self, rank: int) -> str:
        """Tensor-parallel rank `rank`'s scheduler -> worker endpoint (rank 0: `worker_in`)."""
        return self.worker_in if rank == 0 else f"{self.worker_in}_{rank}"

    def tp_store(self) -> str:
        """The FileStore path of the tensor-parallel rendezvous (inside the private directory)."""
        return os.path.join(self.dir, "tp_store")

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> IpcAddresses:
        return cls(**d)


def worker_name(rank: int, tp_size: int) -> str:
    """A worker's process name in Ready / Fatal and the launcher's log: "worker" alone, else
    "worker0", "worker1", ... (one per tensor-parallel rank)."""
    return "worker" if tp_size == 1 else f"worker{rank}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def remove_stale_dirs(root: str | None = None) -> list[str]:
    """Remove this user's `radixrt-<pid>-*` ipc directories whose launcher process is gone."""
    removed = []
    base = root or tempfile.gettempdir()
    for name in os.listdir(base):
        parts = name.split("-")
        if len(parts) < 3 or parts[0] != "radixrt" or not parts[1].isdigit():
            continue
        path = os.path.join(base, name)
        try:
            if os.stat(path).st_uid != os.getuid() or _pid_alive(int(parts[1])):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


class Sender:
    """PUSH end of a channel. `send` never blocks forever: HWM is large and linger bounded."""

    def __init__(self, ctx: zmq.Context, addr: str, bind: bool = False) -> None:
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        (self.sock.bind if bind else self.sock.connect)(addr)

    def send(self, msg: Any) -> None:
        frames = protocol.encode(msg)
        self.sock.send_multipart(frames, copy=_copy_frames(frames))


def _copy_frames(frames: list[bytes | memoryview]) -> bool:
    """True when no frame is a view of an array's memory (protocol.encode makes those only for arrays of
    ZERO_COPY_MIN_BYTES or more). pyzmq copies small frames either way, and its copying send is the
    cheaper one (~12 us against ~21 us per two-frame message, measured on the 2-core dev VM); a view is
    sent zero-copy."""
    return not any(type(f) is memoryview for f in frames)


class FanoutSender:
    """One PUSH socket per tensor-parallel rank: `send` encodes once and queues the same frames on
    every socket, so each rank gets every message in the same order (a PUB socket would drop
    messages for a rank that is slow to connect or falls behind its high-water mark)."""

    def __init__(self, ctx: zmq.Context, addrs: list[str]) -> None:
        self.senders = [Sender(ctx, a) for a in addrs]

    def send(self, msg: Any) -> None:
        frames = protocol.encode(msg)
        copy = _copy_frames(frames)
        for s in self.senders:
            s.sock.send_multipart(frames, copy=copy)


class Receiver:
    """PULL end of a channel accepting only `allowed` message types."""

    def __init__(self, ctx: zmq.Context, addr: str, allowed: tuple[type, ...], bind: bool = True) -> None:
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.allowed = allowed
        (self.sock.bind if bind else self.sock.connect)(addr)

    def recv(self, timeout_ms: int | None = None) -> Any | None:
        """Next message, or None after `timeout_ms` (None: wait forever; 0: poll)."""
        if timeout_ms is not None and not self.sock.poll(timeout_ms):
            return None
        return protocol.decode(self.sock.recv_multipart(), self.allowed)

    def recv_all(self) -> list[Any]:
        """Every message already queued, without waiting."""
        out = []
        while True:
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return out
            out.append(protocol.decode(frames, self.allowed))
