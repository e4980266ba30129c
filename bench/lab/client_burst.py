"""How fast bench/serving.py's load generator itself delivers a `shared-prefix` burst (issue 19).

    python3 bench/lab/client_burst.py --rounds 5          # ~10 s, any machine

A no-op HTTP server (this file, `--role server`: raw asyncio on uvloop, its own process) reads each
request whole, records time.perf_counter() when the body is complete, and answers with an SSE
stream of one event and `data: [DONE]`. The client is bench/serving.py's `send_request` (the raw
transport, the default) sending `--requests` requests of `--prompt-len` token ids at once, as
`_run_sessions` starts them (one task per request, started in a loop). perf_counter is
CLOCK_MONOTONIC, shared by the processes of one machine, so each arrival is read against the
client's start. Per round: the arrivals of the first, the 25th / 50th / 100th percentile request
(ms after the start); medians over the rounds. With `--uvloop` the client runs on uvloop instead of
asyncio's default loop; with `--connections keep-alive` the requests go over connections opened (and
accepted) before the clock starts, as bench/serving.py's default pool does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def run_server(port: int, out: str) -> None:
    import uvloop

    arrivals: list[float] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:  # requests on this connection until the client closes it (keep-alive)
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, OSError):
                break
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            arrivals.append(time.perf_counter())
            sse = (b'data: {"choices":[{"index":0,"text":"a","finish_reason":"length"}],'
                   b'"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: [DONE]\n\n')
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
                         + str(len(sse)).encode() + b"\r\n\r\n" + sse)
            await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.readline)  # one line: dump the arrivals
        Path(out).write_text(json.dumps(arrivals))
        arrivals.clear()
        await loop.run_in_executor(None, sys.stdin.readline)
        server.close()

    uvloop.run(main())


async def one_burst(port: int, n: int, prompt_len: int, seed: int, connections: str) -> float:
    """Send the burst; returns the perf_counter at its start (after the pool, if any, was opened)."""
    import numpy as np

    from bench.serving import BenchConfig, ConnectionPool, send_request
    from bench.serving_metrics import RequestOutcome

    cfg = BenchConfig(base_url=f"http://127.0.0.1:{port}", model="m", timeout_s=60, connections=connections)
    pool = ConnectionPool(cfg.base_url) if connections == "keep-alive" else None
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(100, 40000, size=prompt_len).tolist() for _ in range(n)]
    if pool is not None:
        await pool.warm(n)
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(send_request(None, cfg, "m", RequestOutcome(i, 0, prompt_len, 1), p, pool))
             for i, p in enumerate(prompts)]
    outs = await asyncio.gather(*tasks)
    bad = [o.error for o in outs if o.error]
    if bad:
        raise RuntimeError(bad[0])
    if pool is not None:
        if pool.opened != n or len(pool.idle) != n:
            raise RuntimeError(f"keep-alive: {pool.opened} connections opened, {len(pool.idle)} idle after")
        pool.close()
    return t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["server"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=30111)
    p.add_argument("--arrivals", default="/tmp/client_burst_arrivals.json")
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=2176)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--uvloop", action="store_true")
    p.add_argument("--connections", choices=["keep-alive", "close"], default="close",
                   help="keep-alive: the requests go over connections opened before the clock")
    ns = p.parse_args(argv)
    if ns.role == "server":
        run_server(ns.port, ns.arrivals)
        return 0
    rows = []
    for r in range(ns.rounds):
        srv = subprocess.Popen([sys.executable, __file__, "--role", "server", "--port", str(ns.port),
                                "--arrivals", ns.arrivals], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            assert srv.stdout is not None and srv.stdin is not None
            srv.stdout.readline()
            if ns.uvloop:
                import uvloop

                t0 = uvloop.run(one_burst(ns.port, ns.requests, ns.prompt_len, r, ns.connections))
            else:
                t0 = asyncio.run(one_burst(ns.port, ns.requests, ns.prompt_len, r, ns.connections))
            srv.stdin.write("dump\n")
            srv.stdin.flush()
            for _ in range(200):
                time.sleep(0.01)
                if Path(ns.arrivals).exists() and Path(ns.arrivals).stat().st_size:
                    break
            arr = sorted((a - t0) * 1e3 for a in json.loads(Path(ns.arrivals).read_text()))
            Path(ns.arrivals).unlink()
            srv.stdin.write("stop\n")
            srv.stdin.flush()
        finally:
            srv.wait(timeout=10)
        q = {k: arr[min(len(arr) - 1, int(f * len(arr)))]
             for k, f in (("first", 0), ("p25", 0.25), ("p50", 0.5))}
        q["last"] = arr[-1]
        rows.append(q)
        print(f"round {r}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in q.items()), flush=True)
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    print(f"client {'uvloop' if ns.uvloop else 'asyncio'}, connections {ns.connections}: "
          f"{ns.requests} x {ns.prompt_len} ids, medians: "
          + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
