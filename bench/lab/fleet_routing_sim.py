"""Which smg flags keep cache affinity under load? smg in front of simulated radixrt workers, on CPU.

    .venv/bin/python bench/lab/fleet_routing_sim.py [--concurrency 64] [--groups 32] [--per-group 16]
    .venv/bin/python bench/lab/fleet_routing_sim.py --set 'prefix_hash:--prefix-token-count 64' \
        --set 'cache_aware:--cache-threshold 0' [--only single,round_robin] [--shared-preamble 2000]

Each simulated worker is a small FastAPI app that answers the routes smg uses with radixrt's shapes
(/health, /v1/models, /server_info, /model_info, /get_load, /v1/loads, streaming /v1/completions)
and keeps an LRU of `--capacity` system prompts (a prompt's group is its "[gg]" tag): a hit costs
`--hit-s`, a miss `--miss-s`, and /v1/loads reports running requests and the KV token usage of the
prompts its running requests hold, as a real worker would. The same workload (bench/fleet_bench.py's
text workload) goes through one smg gateway per flag set; the table gives the simulated hit rate,
the share of each group's requests that went to the group's main worker (affinity) and the split.
No model runs: this measures the gateway's routing only, in seconds. The rows of one run share the
workers' ports, so prefix_hash's ring; another run draws other ports. The gateways are
radixrt.gateway's, so they carry its --prefix-token-count (a set's own flags come later and win).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import orjson  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import Response, StreamingResponse  # noqa: E402

from bench.fleet_bench import text_workload  # noqa: E402
from bench.server_proc import free_port  # noqa: E402
from radixrt.gateway import Gateway  # noqa: E402

KEY = "sim"
MODEL = "bench"
PREFIX_TOKENS = 2048
PREAMBLE = ""  # --shared-preamble: the same text before every system prompt (a worker's groups skip it)


class SimWorker:
    """One simulated worker: an LRU of system prompts and the requests it is running."""

    def __init__(self, capacity: int, hit_s: float, miss_s: float, max_running: int) -> None:
        self.capacity, self.hit_s, self.miss_s, self.max_running = capacity, hit_s, miss_s, max_running
        self.lru: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.running: collections.Counter[str] = collections.Counter()
        self.log: list[tuple[str, bool]] = []
        self.port = free_port()

    def load(self) -> dict:
        running = sum(self.running.values())
        total = self.capacity * PREFIX_TOKENS
        used = min(total, len(self.running) * PREFIX_TOKENS)
        return {
            "dp_rank": 0,
            "num_running_reqs": running,
            "num_waiting_reqs": 0,
            "num_total_reqs": running,
            "num_used_tokens": used,
            "max_total_num_tokens": total,
            "token_usage": used / total,
            "gen_throughput": 0.0,
            "cache_hit_rate": 0.0,
            "utilization": running / self.max_running,
            "max_running_requests": self.max_running,
        }

    def touch(self, group: str) -> bool:
        hit = group in self.lru
        self.lru[group] = None
        self.lru.move_to_end(group)
        while len(self.lru) > self.capacity:
            self.lru.popitem(last=False)
        self.log.append((group, hit))
        return hit

    def app(self) -> FastAPI:
        app = FastAPI()

        def js(obj: object) -> Response:
            return Response(orjson.dumps(obj), media_type="application/json")

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

        @app.get("/health_generate")
        async def health_generate() -> Response:
            return js({"ok": True})

        @app.get("/v1/models")
        async def models() -> Response:
            return js(
                {
                    "object": "list",
                    "data": [
                        {
                            "id": MODEL,
                            "object": "model",
                            "created": 0,
                            "owned_by": "radixrt",
                            "root": MODEL,
                            "max_model_len": 8192,
                        }
                    ],
                }
            )

        @app.get("/server_info")
        @app.get("/get_server_info")
        async def server_info() -> Response:
            return js(
                {
                    "served_model_name": MODEL,
                    "model_path": MODEL,
                    "page_size": 16,
                    "context_length": 8192,
                    "max_running_requests": self.max_running,
                }
            )

        @app.get("/model_info")
        @app.get("/get_model_info")
        async def model_info() -> Response:
            return js(
                {
                    "model_path": MODEL,
                    "tokenizer_path": None,
                    "served_model_name": MODEL,
                    "is_generation": True,
                    "model_type": "qwen2",
                    "context_length": 8192,
                }
            )

        @app.get("/get_load")
        async def get_load() -> Response:
            ld = self.load()
            return js(
                [
                    {
                        "dp_rank": 0,
                        "num_reqs": ld["num_total_reqs"],
                        "num_waiting_reqs": 0,
                        "num_tokens": ld["num_used_tokens"],
                    }
                ]
            )

        @app.get("/v1/loads")
        async def loads() -> Response:
            return js({"timestamp": "", "dp_rank_count": 1, "loads": [self.load()]})

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = orjson.loads(await request.body())
            group = body["prompt"][len(PREAMBLE) :][:40]
            hit = self.touch(group)
            self.running[group] += 1

            async def stream():  # one chunk after the prefill, one at the end, as SSE
                try:
                    await asyncio.sleep(self.hit_s if hit else self.miss_s)
                    chunk = {
                        "id": "c",
                        "object": "text_completion",
                        "model": MODEL,
                        "choices": [{"index": 0, "text": "x", "finish_reason": None}],
                    }
                    yield b"data: " + orjson.dumps(chunk) + b"\n\n"
                    await asyncio.sleep(self.hit_s)
                    chunk["choices"][0]["finish_reason"] = "length"
                    chunk["usage"] = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                    yield b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n"
                finally:
                    self.running[group] -= 1
                    if not self.running[group]:
                        del self.running[group]

            return StreamingResponse(stream(), media_type="text/event-stream")

        return app

    def serve_in_thread(self) -> None:
        server = uvicorn.Server(
            uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_level="warning")
        )
        threading.Thread(target=server.run, daemon=True).start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("simulated worker did not start")


async def drive(base_url: str, prompts: list[str], concurrency: int) -> int:
    """Send every prompt as a streaming completion at `concurrency`; returns the failures."""
    sem, failures = asyncio.Semaphore(concurrency), 0
    async with httpx.AsyncClient(
        base_url=base_url,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
        limits=httpx.Limits(max_connections=concurrency + 4),
    ) as client:

        async def one(p: str) -> None:
            nonlocal failures
            async with sem:
                body = {"model": MODEL, "prompt": p, "max_tokens": 2, "stream": True}
                try:
                    async with client.stream("POST", "/v1/completions", json=body) as r:
                        if r.status_code != 200:
                            failures += 1
                        async for _ in r.aiter_bytes():
                            pass
                except httpx.HTTPError:  # a reset under the shared machine's load: counted, not fatal
                    failures += 1

        await asyncio.gather(*(one(p) for p in prompts))
    return failures


def summarize(workers: list[SimWorker], start: list[int]) -> dict:
    logs = [w.log[s:] for w, s in zip(workers, start, strict=True)]
    n = sum(len(g) for g in logs)
    hits = sum(h for g in logs for _, h in g)
    per_group: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for i, g in enumerate(logs):
        for group, _ in g:
            per_group[group][i] += 1
    affinity = sum(c.most_common(1)[0][1] for c in per_group.values()) / max(n, 1)
    homes = collections.Counter(c.most_common(1)[0][0] for c in per_group.values())
    return {"hit_rate": hits / max(n, 1), "affinity": affinity, "split": [len(g) for g in logs],
            "groups_per_worker": [homes[i] for i in range(len(logs))]}


OFF = "--disable-worker-overload-protection"
# name: (policy, smg flags). radixrt.gateway adds --prefix-token-count 64 (the fleet's default) to every
# gateway; a set's own flags come later and win.
FLAG_SETS = {
    "round_robin": ("round_robin", ""),
    "prefix_hash, 64 tokens (the fleet's default)": ("prefix_hash", ""),
    "prefix_hash (smg defaults: 256 tokens)": ("prefix_hash", "--prefix-token-count 256"),
    "prefix_hash, 256 tokens, balance abs 64": (
        "prefix_hash", "--prefix-token-count 256 --prefix-hash-balance-abs-threshold 64"),
    "cache_aware (smg defaults)": ("cache_aware", ""),
    "cache_aware, overload protection off": ("cache_aware", OFF),
    "cache_aware, protection off, rel 4": ("cache_aware", f"{OFF} --balance-rel-threshold 4"),
    "cache_aware, protection off, rel 4, abs 256": (
        "cache_aware", f"{OFF} --balance-rel-threshold 4 --balance-abs-threshold 256"),
    "cache_aware, abs 8, rel 1.2": ("cache_aware", "--balance-abs-threshold 8 --balance-rel-threshold 1.2"),
    "cache_aware, protection off, abs 8, rel 1.2": (
        "cache_aware", f"{OFF} --balance-abs-threshold 8 --balance-rel-threshold 1.2"),
    "power_of_two": ("power_of_two", ""),
    "cache_aware, protection off, rel 4, load poll 1 s": (
        "cache_aware", f"{OFF} --balance-rel-threshold 4 --load-monitor-interval 1"),
    "cache_aware, protection off, rel 4, p2c by requests": (
        "cache_aware", f"{OFF} --balance-rel-threshold 4 --power-of-two-load-metric requests"),
    "cache_aware, load poll 1 s": ("cache_aware", "--load-monitor-interval 1"),
    "single server (2 x capacity, no gateway)": ("single", ""),
}


def run_single(ns: argparse.Namespace, prompts: list[str]) -> dict:
    """The baseline: one simulated worker with both workers' cache (2 x --capacity), no gateway."""
    w = SimWorker(2 * ns.capacity, ns.hit_s, ns.miss_s, 2 * ns.concurrency)
    w.serve_in_thread()
    t0 = time.perf_counter()
    failures = asyncio.run(drive(f"http://127.0.0.1:{w.port}", prompts, ns.concurrency))
    return summarize([w], [0]) | {"wall_s": time.perf_counter() - t0, "failures": failures}


def chosen_sets(ns: argparse.Namespace) -> dict[str, tuple[str, tuple[str, ...]]]:
    """FLAG_SETS filtered by --only (all of them without --only or --set), then each --set."""
    sets = {name: (policy, tuple(shlex.split(flags))) for name, (policy, flags) in FLAG_SETS.items()
            if not ns.only or any(name.startswith(o) for o in ns.only.split(","))}
    if ns.only is None and ns.set:
        sets = {}
    for spec in ns.set:
        policy, _, flags = spec.partition(":")
        sets[spec] = (policy, tuple(shlex.split(flags)))
    return sets


def run_gateway(gw: Gateway, workers: list[SimWorker], prompts: list[str], concurrency: int) -> dict:
    """Start `gw`, register the workers, empty their caches, drive the workload; `summarize`'s dict."""
    urls = [f"http://127.0.0.1:{w.port}" for w in workers]
    gw.start()
    try:
        for u in urls:
            gw.register(u)
        gw.wait_healthy(set(urls), 60)
        for w in workers:
            w.lru.clear()
        start = [len(w.log) for w in workers]
        t0 = time.perf_counter()
        failures = asyncio.run(drive(gw.base_url, prompts, concurrency))
        return summarize(workers, start) | {"wall_s": time.perf_counter() - t0, "failures": failures}
    finally:
        gw.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--per-group", type=int, default=16)
    ap.add_argument("--capacity", type=int, default=18, help="system prompts each worker's cache holds")
    ap.add_argument("--hit-s", type=float, default=0.2)
    ap.add_argument("--miss-s", type=float, default=0.6)
    ap.add_argument("--only", help="comma-separated subset of the flag sets (by prefix)")
    ap.add_argument("--set", action="append", default=[], metavar="POLICY[:FLAGS]",
                    help="an extra flag set, e.g. 'prefix_hash:--prefix-token-count 64' (repeatable)")
    ap.add_argument("--prefix-len", type=int, default=600, help="characters of each system prompt")
    ap.add_argument("--log-dir", help="keep the gateways' logs here (pass --log-level debug in a set)")
    ap.add_argument(
        "--distinct-start",
        action="store_true",
        help="system prompts without the common '[' start (the group tag moved to the end)",
    )
    ap.add_argument("--shared-preamble", type=int, default=0, metavar="CHARS",
                    help="the same CHARS characters before every system prompt (one boilerplate preamble)")
    ns = ap.parse_args()
    global PREAMBLE
    PREAMBLE = ("You are a careful assistant. " * (ns.shared_preamble // 29 + 1))[: ns.shared_preamble]
    sizes = {"groups": ns.groups, "per_group": ns.per_group, "prefix_len": ns.prefix_len, "question_len": 32}
    prompts = text_workload(sizes)
    if ns.distinct_start:  # "[gg] rest" -> "rest [gg]": no two groups share a first character... mostly
        prompts = [p[5 : sizes["prefix_len"]] + p[:5] + p[sizes["prefix_len"] :] for p in prompts]
    prompts = [PREAMBLE + p for p in prompts]
    workers = [SimWorker(ns.capacity, ns.hit_s, ns.miss_s, ns.concurrency) for _ in range(2)]
    for w in workers:
        w.serve_in_thread()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        td = Path(ns.log_dir or tmp)
        td.mkdir(parents=True, exist_ok=True)
        for name, (policy, flags) in chosen_sets(ns).items():
            if policy == "single":
                res = run_single(ns, prompts)
            else:
                gw = Gateway("127.0.0.1", free_port(), KEY, policy, td / f"gw{len(rows)}.log", flags)
                res = run_gateway(gw, workers, prompts, ns.concurrency)
            rows.append((name, res))
            print(f"{name}: {res}", flush=True)
    print("\n| gateway | hit rate | affinity | split | wall s |\n|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['hit_rate']:.3f} | {r['affinity']:.3f} | {r['split']} | {r['wall_s']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
