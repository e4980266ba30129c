"""Entry point of the tokenizer process: `run_tokenizer(args, addrs, model_dir, worker_info)`.

Start-up order: bind the HTTP port; load the tokenizer; get the worker's facts (`worker_info()`: the
launcher starts this process beside the worker and sends them once the worker is ready, so the two
loads overlap); bind the PULL socket (scheduler -> tokenizer) and connect the
PUSH socket; bind the HTTP port ourselves (so a busy port is a clear start-up error, not a uvicorn
`sys.exit`); start uvicorn on that socket inside a uvloop event loop; once uvicorn reports
`started` (it is accepting connections), send `protocol.Ready("tokenizer")` to the launcher.
SIGTERM with `--graceful-shutdown-timeout T` > 0 first drains: new requests get 503 "server is
shutting down" while in-flight ones run on, for at most T seconds. Then (at once for SIGINT or T = 0)
every request still in flight ends with that 503 (a stream: an SSE error event, then `data: [DONE]`),
uvicorn closes the connections (waiting at most GRACEFUL_SHUTDOWN_S), then the manager closes its
sockets and `run_tokenizer` returns (exit code 0). The launcher sends SIGINT when a sibling process
died (nothing in flight can finish then) and SIGTERM for a graceful stop.
After start-up the heap is frozen out of the garbage collector's reach (`tune_gc`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
import uvloop
import zmq

from radixrt import protocol
from radixrt.config import DEFAULT_MODEL_NAME, PROTOCOL_VERSION, ServerArgs
from radixrt.ipc import IpcAddresses, Sender

from .manager import SHUTDOWN_ERROR, TokenizerManager
from .server import create_app
from .serving_context import ServingContext

logger = logging.getLogger(__name__)
GRACEFUL_SHUTDOWN_S = 2  # in-flight requests get this long; the launcher kills at 5 s
# uvicorn closes an idle keep-alive connection after 5 s by default, the same as httpx's (and so the
# openai client's) pool expiry: a request sent on a connection just as the server closes it fails with
# a read error (seen in the soak at concurrency 256). Clients expire their idle connections first.
KEEP_ALIVE_S = 75


def tune_gc() -> None:
    """Keep the cyclic GC off the streaming hot path.

    After start-up the heap holds a few hundred thousand long-lived objects (transformers, the
    tokenizer, FastAPI); a full collection walks all of them (measured on a 2-core VM: 300-500 ms, every
    ~20 s under load: a stall of every stream). `gc.freeze()` moves them to the permanent generation,
    out of the collector's reach; later full collections only walk what the requests allocated.
    Young-generation thresholds stay at CPython's defaults (a larger one made single pauses longer).
    """
    gc.collect()
    gc.freeze()


def served_model_name(args: ServerArgs, model_dir: Path) -> str:
    """--served-model-name, else the model's name: the default model's name when no --model-path was
    given, else the directory (or .gguf file) name without the loader's GGUF cache decorations
    ("<name>.Q4_1-<12 hex digits>" -> "<name>")."""
    if args.served_model_name:
        return args.served_model_name
    if args.model_path is None:
        return DEFAULT_MODEL_NAME
    name = Path(args.model_path).name or model_dir.name
    name = re.sub(r"\.gguf$", "", name, flags=re.I)
    name = re.sub(r"-[0-9a-f]{12}$", "", name)
    return re.sub(r"\.(I?Q\d[A-Za-z0-9_]*|F16|F32|BF16)$", "", name, flags=re.I)


def load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def build_context(args: ServerArgs, addrs: IpcAddresses, tokenizer: Any, model_dir: Path,
                  worker_info: dict[str, Any], on_done: Any = None) -> ServingContext:
    """The manager (sockets bound) and everything the handlers need."""
    # the worker's figure when it gives one, even 0 (a falsy 0 fell through to the tokenizer's ~1e30
    # placeholder, which /v1/models then failed to serialize: a 500)
    context_length = next((int(v) for v in (worker_info.get("context_length"), args.context_length,
                                            getattr(tokenizer, "model_max_length", None)) if v is not None),
                          2048)
    manager = TokenizerManager(addrs, max_inflight=args.max_running_requests + args.max_queued_requests)
    manager.bind()
    return ServingContext(manager=manager, tokenizer=tokenizer, args=args,
                          served_model=served_model_name(args, model_dir), context_length=context_length,
                          on_done=on_done)


def bind_http(host: str, port: int) -> socket.socket:
    """Listen on host:port. Raises OSError with a one-line message when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def serve(ctx: ServingContext, sock: socket.socket, on_started: Any = None,
                metrics_routes: Any = None) -> None:
    """Run uvicorn on `sock` until SIGTERM/SIGINT (or `server.should_exit`); then close the manager.

    `on_started(server)` runs once uvicorn accepts connections (it gets the uvicorn.Server, whose
    `should_exit` stops it).
    """
    app = create_app(ctx, extra_routes=metrics_routes)
    config = uvicorn.Config(app, log_level=ctx.args.log_level.lower(), access_log=False,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, lifespan="on",
                            timeout_keep_alive=KEEP_ALIVE_S)
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # we own the signals
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, _request_exit, server, ctx, sig)
        except (RuntimeError, ValueError):  # not the main thread (tests)
            pass
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    watcher = asyncio.ensure_future(_end_streams_on_exit(server, ctx))
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if not server.started:
            try:
                await task
            except SystemExit:  # uvicorn exits this way when its lifespan start-up fails
                pass
            raise RuntimeError("the HTTP server failed to start (see the log above)")
        tune_gc()
        if on_started is not None:
            on_started(server)
        await task
    finally:
        watcher.cancel()
        ctx.manager.closing = True
        await ctx.manager.close()


async def _end_streams_on_exit(server: uvicorn.Server, ctx: ServingContext) -> None:
    """As soon as shutdown starts (SIGTERM/SIGINT or `should_exit`), end every in-flight request with
    503 "server is shutting down" (after a sibling process died, with the launcher's reason: "server is
    shutting down: the scheduler process exited unexpectedly"): a stream gets an SSE error event and
    `data: [DONE]` (then uvicorn closes the connection), a non-streamed request a 503 JSON error. The
    launcher stops the scheduler at the same time, so no more tokens would come; waiting out the grace
    period would only delay the exit."""
    while not server.should_exit:
        await asyncio.sleep(0.05)
    ctx.manager.closing = True
    reason = ctx.manager.addrs.read_stop_reason()  # left by the launcher when a sibling died
    n = ctx.manager.fail_all(f"{SHUTDOWN_ERROR}: {reason}" if reason else SHUTDOWN_ERROR)
    if n:
        logger.info("shutting down: ended %d in-flight samples with an error", n)


def _request_exit(server: uvicorn.Server, ctx: ServingContext, sig: int) -> None:
    drain_s = ctx.args.graceful_shutdown_timeout if sig == signal.SIGTERM else 0.0
    if drain_s <= 0 or ctx.manager.closing:  # a second signal ends the drain
        logger.info("signal %d: shutting down the HTTP server", sig)
        server.should_exit = True
        return
    logger.info("signal %d: draining %d in-flight samples for at most %g s; new requests get 503",
                sig, ctx.manager.num_inflight, drain_s)
    ctx.manager.closing = True
    asyncio.ensure_future(_drain_then_exit(server, ctx, drain_s))


async def _drain_then_exit(server: uvicorn.Server, ctx: ServingContext, drain_s: float) -> None:
    """Let in-flight samples finish (polling), for at most drain_s seconds; then stop the server."""
    deadline = asyncio.get_running_loop().time() + drain_s
    while ctx.manager.num_inflight and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    logger.info("drain over (%d samples still in flight)", ctx.manager.num_inflight)
    server.should_exit = True


def run_tokenizer(args: ServerArgs, addrs: IpcAddresses, model_dir: Path,
                  worker_info: Callable[[], dict[str, Any]]) -> None:
    """Process entry point (see module docstring); `worker_info()` returns the worker's Ready facts
    (it may block until the worker is ready). Raises on a start-up failure (the caller reports it)."""
    from .metrics import Metrics

    sock = bind_http(args.host, args.port)  # first: a busy port fails fast, before the slow load
    tokenizer = load_tokenizer(model_dir)
    metrics = Metrics()
    ctx = build_context(args, addrs, tokenizer, model_dir, worker_info(), on_done=metrics.on_request_done)
    zctx = zmq.Context()
    launcher = Sender(zctx, addrs.launcher_in)

    def ready(_server: uvicorn.Server) -> None:
        launcher.send(protocol.Ready(process="tokenizer", protocol_version=PROTOCOL_VERSION, pid=os.getpid(),
                                     info={"host": args.host, "port": args.port,
                                           "served_model_name": ctx.served_model}))
        logger.info("serving %s on http://%s:%d", ctx.served_model, args.host, args.port)

    try:
        uvloop.run(serve(ctx, sock, on_started=ready, metrics_routes=metrics.install))
    finally:
        sock.close()
        launcher.sock.close(linger=1000)
        zctx.term()
