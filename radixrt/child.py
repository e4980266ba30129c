"""Entry point of each child process: `python -m radixrt.child <role>` with a JSON spec on stdin.

The spec is `{"args": ServerArgs dict, "addrs": IpcAddresses dict, "model_dir": str, "extra": {...}}`,
one line. The scheduler and the tokenizer process need the worker's Ready facts (`worker_info`): the
spec carries them, or else the launcher starts them beside the worker and writes the facts as a second
JSON line once every worker rank is Ready; meanwhile they import their modules and load their
tokenizers (the slow part of their start-up). JSON on stdin (not pickle) keeps the launcher -> child
hop free of code execution. The child asks
the kernel to kill it when the launcher dies (PR_SET_PDEATHSIG), so no process outlives the server.
"""

from __future__ import annotations

import signal

# Until main() takes over, SIGINT ends this process quietly: the launcher sends it to the tokenizer
# process when a sibling fails at start-up (a model that cannot be loaded), often while this child is
# still importing its modules, where Python's default handler printed a KeyboardInterrupt traceback.
signal.signal(signal.SIGINT, signal.SIG_DFL)

import ctypes  # noqa: E402 - after the signal disposition above
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import orjson  # noqa: E402
import zmq  # noqa: E402

from radixrt.config import ServerArgs  # noqa: E402
from radixrt.ipc import IpcAddresses, Sender  # noqa: E402
from radixrt.protocol import Fatal  # noqa: E402

ROLES = ("worker", "scheduler", "tokenizer")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: deliver SIGKILL to this process when its parent (the launcher) exits."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass
    if os.getppid() == 1:  # the launcher is already gone
        os._exit(1)


def _report_fatal(addrs: IpcAddresses, role: str, message: str, exit_code: int) -> None:
    ctx = zmq.Context.instance()
    Sender(ctx, addrs.launcher_in).send(Fatal(process=role, message=message, exit_code=exit_code))


def worker_info_source(extra: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """How the role gets the worker's Ready facts, when it first needs them: the spec's
    `extra["worker_info"]` when present, else the next JSON line on stdin (the launcher writes it
    once every worker rank is Ready). Exits the process (code 0) when stdin closes first: the
    launcher gave up on the start and stops this child anyway."""
    if "worker_info" in extra:
        return lambda: extra["worker_info"]

    def from_stdin() -> dict[str, Any]:
        line = sys.stdin.buffer.readline()
        if not line.strip():
            sys.exit(0)
        return orjson.loads(line)

    return from_stdin


def _run(role: str, args: ServerArgs, addrs: IpcAddresses, model_dir: Path, extra: dict) -> None:
    if role == "worker":
        from radixrt.worker.worker_proc import run_worker

        run_worker(args, addrs, model_dir, int(extra.get("tp_rank", 0)))
    elif role == "scheduler":
        from radixrt.scheduler.scheduler_proc import run_scheduler

        run_scheduler(args, addrs, worker_info_source(extra), model_dir)
    else:
        from radixrt.tokenizer_proc.main import run_tokenizer

        run_tokenizer(args, addrs, model_dir, worker_info_source(extra))


def main() -> None:
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role not in ROLES:
        sys.exit(f"usage: python -m radixrt.child {{{','.join(ROLES)}}}  (spec on stdin)")
    _die_with_parent()
    spec = orjson.loads(sys.stdin.buffer.readline())  # the first line; worker facts may follow
    args = ServerArgs.from_dict(spec["args"])
    addrs = IpcAddresses.from_dict(spec["addrs"])
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"[%(asctime)s {role}] %(levelname)s %(message)s", datefmt="%H:%M:%S")
    # The launcher owns Ctrl-C; children stop on SIGTERM (default action: terminate).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _run(role, args, addrs, Path(spec["model_dir"]), spec.get("extra", {}))
    except Exception as e:  # noqa: BLE001 - report one line to the launcher, details to the log
        logging.getLogger(__name__).error("%s", traceback.format_exc())
        # A model that cannot be loaded is the user's input error: exit code 2, as for the launcher.
        code = 2 if type(e).__name__ == "ModelLoadError" else 1
        _report_fatal(addrs, role, f"{type(e).__name__}: {e}", code)
        sys.exit(code)


if __name__ == "__main__":
    main()
