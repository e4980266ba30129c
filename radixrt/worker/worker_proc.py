"""Worker process entry point: receive ForwardBatches, run them, send ForwardResults.

Sockets (see radixrt/ipc.py): binds `worker_in` (scheduler -> worker), connects
`scheduler_results` (worker -> scheduler) and `launcher_in` (handshake). Start-up failures are
reported to the launcher as one `Fatal` line and exit code 1 (2 for a ModelLoadError);
`WorkerControl("shutdown")` exits 0.

With --tp-size N one such process runs per rank (docs/tensor_parallel.md): rank r binds its own
`worker_in_for(r)`, joins the torch.distributed group, and runs every pass; all ranks sample the
same tokens, and rank 0 alone sends the ForwardResults (the other ranks' are dropped).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import torch
import zmq

from radixrt import protocol
from radixrt.config import PROTOCOL_VERSION, Env, ServerArgs
from radixrt.gc_policy import freeze_startup_heap
from radixrt.ipc import IpcAddresses, Receiver, Sender, worker_name
from radixrt.models.loader import ModelLoadError

log = logging.getLogger("radixrt.worker")


def cpu_threads(tp_size: int = 1) -> int:
    """Torch threads on CPU: RADIXRT_CPU_THREADS if set, else every core we may run on, shared by
    the tensor-parallel ranks (at least one each).

    All cores, not cores - 1: the scheduler and tokenizer processes use under 5% of a core while
    the worker decodes (measured on 2 cores, docs/kernels.md "CPU threads"), so a core left to them
    idles, and the worker's decode step is bound by one core's memory bandwidth. On a machine shared
    with other CPU-heavy work, pass --cpu-threads (spinning OpenMP threads that lose their core stall
    every parallel region)."""
    env = Env.read().cpu_threads
    if env is not None:
        return env
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // tp_size)


class _Dropped:
    """The result channel of a tensor-parallel rank other than 0: its ForwardResults (the same
    tokens as rank 0's) are not sent."""

    def send(self, msg: object) -> None:
        pass


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def run_worker(args: ServerArgs, addrs: IpcAddresses, model_dir: Path, tp_rank: int = 0) -> None:
    """Start the model runner (tensor-parallel rank `tp_rank` of --tp-size), handshake with the
    launcher, then serve until shutdown.

    Never returns normally: exits the process with 0 on shutdown, 1 on a start-up failure.
    """
    ctx = zmq.Context()
    to_launcher = Sender(ctx, addrs.launcher_in)
    name = worker_name(tp_rank, args.tp_size)
    try:
        runner, inbox, results = _start(args, addrs, ctx, Path(model_dir), tp_rank)
    except Exception as e:  # report any start-up failure as one line, then exit non-zero
        if isinstance(e, ModelLoadError):  # the user's input, one line meant for them: no traceback
            log.error("worker start-up failed: %s", e)
        else:
            log.exception("worker start-up failed")
        code = 2 if isinstance(e, ModelLoadError) else 1  # a bad model is the user's input error
        to_launcher.send(protocol.Fatal(process=name, message=_one_line(e), exit_code=code))
        to_launcher.sock.close(linger=1000)
        sys.exit(code)
    info = runner.info()
    freeze_startup_heap()
    log.info("worker ready: %s", info)
    to_launcher.send(protocol.Ready(process=name, protocol_version=PROTOCOL_VERSION, pid=os.getpid(),
                                    info=info))
    _serve(runner, inbox, results)
    if args.tp_size > 1:  # a gloo / NCCL group left to the interpreter's exit can abort the process
        from radixrt.parallel.group import destroy_tp_group

        destroy_tp_group()
    ctx.destroy(linger=1000)
    sys.exit(0)


def _start(args: ServerArgs, addrs: IpcAddresses, ctx: zmq.Context, model_dir: Path, tp_rank: int):
    from radixrt.worker.model_runner import ModelRunner

    device = args.resolved_device()
    if device == "cpu":
        torch.set_num_threads(args.cpu_threads or cpu_threads(args.tp_size))
    torch.manual_seed(args.random_seed)
    inbox = Receiver(ctx, addrs.worker_in_for(tp_rank), protocol.SCHEDULER_TO_WORKER)
    results = Sender(ctx, addrs.scheduler_results) if tp_rank == 0 else _Dropped()
    tp = None
    if args.tp_size > 1:
        from radixrt.parallel.group import init_tp_group

        tp = init_tp_group(tp_rank, args.tp_size, addrs.tp_store(), device)
    runner = ModelRunner(args, model_dir, tp)
    return runner, inbox, results


# idle time (ms without a message) before the first prefault slice of the CPU KV pool after a message
# (_serve); the next slices follow back to back while nothing arrives
PREFAULT_IDLE_MS = 20


# CPU: after sending the result of a pass with prompt rows (first tokens), wait this long before
# launching the next pass (_serve), so that the scheduler and tokenizer processes deliver those tokens
# on idle cores instead of competing with the pass's OpenMP threads
PREFILL_HANDOFF_S = 0.002


def _serve(runner, inbox: Receiver, results: Sender | _Dropped) -> None:
    """Loop until a shutdown control message. A failing batch is fatal: it is logged and re-raised.

    At most one pass is pending (launched, result not yet sent). While one is, the loop polls for
    the next ForwardBatch and the pending pass's completion at once: a batch that arrives first is
    launched behind the pending pass (the device goes straight from one to the next), then the
    pending result is sent. On CPU, where a launch computes the whole pass on every core, a result
    that carries first tokens (the pass had prompt rows, extend_len > 1) goes out first and the next
    pass starts PREFILL_HANDOFF_S later: the scheduler and tokenizer processes need a core each to
    pass the tokens on, and with the pass's threads on every core they waited for one (the first
    token reached the tokenizer 3-6 ms after the result left the worker, against ~1.3 ms with the
    pause; docs/scheduling.md). With --disable-overlap-schedule the scheduler sends a pass only after
    the previous result, so every pass is launched and finished alone. On CPU `launch` computes
    the whole pass, so nothing is ever left pending for long.

    A pass with deferred grammar rows (ForwardBatch.grammar_deferred) is launched (its forward runs
    at once), then the pending result is sent, and only then does the loop block for the pass's
    GrammarMask: the scheduler sends that mask after processing the pending result, so sending
    the result first is what keeps the two from waiting on each other.
    """
    pending = None
    # while idle (no pass pending, nothing received for PREFAULT_IDLE_MS) a CPU runner writes into its
    # KV pool's untouched memory pages a slice at a time (PagedKVPool.prefault_step), so that prefills
    # do not pay for them; the wait keeps the slices out of the gaps between back-to-back passes, and
    # once idle the slices follow each other with a poll between them, so that a pass that arrives
    # waits for at most one slice and the whole pool is written in its few seconds of slice time
    prefault = getattr(runner, "prefault_step", None)
    on_cpu = getattr(getattr(runner, "device", None), "type", None) == "cpu"
    pending_prefill = False  # the pending pass had prompt rows (its result carries first tokens)
    prefault_wait = PREFAULT_IDLE_MS  # 0 while idle slices run back to back (a poll between each two)
    while True:
        if pending is None and prefault is not None:
            msg = inbox.recv(timeout_ms=prefault_wait)
            if msg is None:
                if not prefault():
                    prefault = None
                prefault_wait = 0
                continue
            prefault_wait = PREFAULT_IDLE_MS
        elif pending is None:
            msg = inbox.recv()
        else:
            msg = inbox.recv(timeout_ms=0)
            if msg is None:
                if runner.poll(pending):
                    results.send(runner.finish(pending))
                    pending = None
                continue
        if isinstance(msg, protocol.WorkerControl):
            if msg.kind == "shutdown":
                if pending is not None:
                    results.send(runner.finish(pending))
                log.info("worker shutting down")
                return
            continue  # "flush": nothing cached on the worker side today
        if isinstance(msg, protocol.GrammarMask):
            raise ValueError(f"GrammarMask for pass {msg.batch_id}: no pass awaits a mask")
        if pending is not None and runner.poll(pending):  # already done (always so on CPU): send first
            results.send(runner.finish(pending))
            pending = None
            if on_cpu and pending_prefill:  # let the first tokens through before the cores are taken
                time.sleep(PREFILL_HANDOFF_S)
        try:
            launched = runner.launch(msg)
        except Exception:
            log.error("forward failed on batch %d: mode=%d req_rows=%s extend_lens=%s seq_lens=%s "
                      "num_input_ids=%d", msg.batch_id, msg.mode, msg.req_rows.tolist(),
                      msg.extend_lens.tolist(), msg.seq_lens.tolist(), len(msg.input_ids))
            raise
        if pending is not None:
            results.send(runner.finish(pending))
            pending = None
        pending_prefill = len(msg.extend_lens) > 0 and int(msg.extend_lens.max()) > 1
        if len(msg.grammar_deferred) and not _await_mask(runner, inbox, launched, msg.batch_id):
            log.info("worker shutting down")
            return
        pending = launched


def _await_mask(runner, inbox: Receiver, launched, batch_id: int) -> bool:
    """Block until pass `batch_id`'s GrammarMask arrives and let the runner sample with it. False
    on a shutdown meanwhile (the pass is dropped unsampled).

    Raises:
        ValueError: anything but that pass's mask (or a control message) arrives first.
    """
    while True:
        msg = inbox.recv()
        if isinstance(msg, protocol.GrammarMask) and msg.batch_id == batch_id:
            runner.supply_mask(launched, msg)
            return True
        if isinstance(msg, protocol.WorkerControl):
            if msg.kind == "shutdown":
                return False
            continue
        name = type(msg).__name__
        raise ValueError(f"{name} {msg.batch_id} arrived while pass {batch_id} awaits its GrammarMask")
