"""Multi-turn, shared-prefix chat through a real server, radix cache on versus off.

Each of `--clients` conversations starts with one shared system prompt (`--system-len` tokens)
plus its own first message, and every later turn resends the whole history (previous prompt +
the server's answer, as token ids, + `--turn-len` new tokens). Clients run concurrently; the turns
of one client run in order. For every turn we record TTFT (ms), the prompt length and
usage.prompt_tokens_details.cached_tokens; per configuration we report throughput and hit rate.

The bar (issue 3): with the cache on, a turn's TTFT is set by its new tokens, not its history, so
TTFT stays flat as the history grows; with the cache off it grows with the history.

    python bench/radix_cache_bench.py --out bench/results/radix-cache-cpu.json           # CPU, default model
    python bench/radix_cache_bench.py --device cuda --model-path bench/configs/qwen2.5-7b-instruct \
        --load-format dummy --system-len 2048 --clients 16 --turns 6 --turn-len 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.server_proc import start_server  # noqa: E402
from radixrt.config import Env  # noqa: E402
from radixrt.models.loader import resolve_model_dir  # noqa: E402


async def one_turn(client: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int
                   ) -> dict[str, Any]:
    """Stream one completion; returns ttft_ms, e2e_ms, the answer's token ids and the usage."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, ids, usage = None, [], {}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            for ch in obj["choices"]:
                if ch.get("token_ids") and ttft is None:
                    ttft = (time.perf_counter() - t0) * 1e3
                ids.extend(ch.get("token_ids", []))
            usage = obj.get("usage") or usage
    return {"ttft_ms": ttft, "e2e_ms": (time.perf_counter() - t0) * 1e3, "ids": ids, "usage": usage}


async def run_clients(base_url: str, ns: argparse.Namespace, vocab: int) -> dict[str, Any]:
    rng = random.Random(ns.seed)
    draw = lambda n: [rng.randrange(1000, vocab) for _ in range(n)]  # noqa: E731
    system = draw(ns.system_len)
    firsts = [system + draw(ns.turn_len) for _ in range(ns.clients)]
    turns: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]

        async def converse(c: int) -> None:
            prompt = firsts[c]
            for t in range(ns.turns):
                res = await one_turn(client, model, prompt, ns.output_len)
                u = res["usage"]
                turns.append({"client": c, "turn": t, "prompt_tokens": u["prompt_tokens"],
                              "cached_tokens": u["prompt_tokens_details"]["cached_tokens"],
                              "completion_tokens": u["completion_tokens"], "ttft_ms": res["ttft_ms"],
                              "e2e_ms": res["e2e_ms"]})
                prompt = prompt + res["ids"] + draw(ns.turn_len)

        t0 = time.perf_counter()
        await asyncio.gather(*(converse(c) for c in range(ns.clients)))
        wall = time.perf_counter() - t0
    prompt_tokens = sum(t["prompt_tokens"] for t in turns)
    per_turn = [{"turn": k,
                 "mean_prompt_tokens": statistics.mean(t["prompt_tokens"] for t in turns if t["turn"] == k),
                 "median_ttft_ms": statistics.median(t["ttft_ms"] for t in turns if t["turn"] == k)}
                for k in range(ns.turns)]
    return {"wall_s": wall, "requests": len(turns),
            "output_tok_s": sum(t["completion_tokens"] for t in turns) / wall,
            "input_tok_s": prompt_tokens / wall,
            "cache_hit_rate": sum(t["cached_tokens"] for t in turns) / max(prompt_tokens, 1),
            "median_ttft_ms": statistics.median(t["ttft_ms"] for t in turns),
            "per_turn": per_turn, "turns": turns}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-len", type=int, default=512)
    p.add_argument("--turn-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    ns = p.parse_args(argv)
    model_dir = resolve_model_dir(ns.model_path, Env.read().cache_dir, ns.load_format)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    report: dict[str, Any] = {"config": vars(ns), "date": time.strftime("%Y-%m-%d"), "runs": {}}
    for name, flags in (("cache_on", []), ("cache_off", ["--disable-radix-cache"])):
        extra = [*flags, "--load-format", ns.load_format]
        server = start_server(model_dir, Path(tempfile.mkdtemp()), *extra, device=ns.device)
        try:
            report["runs"][name] = asyncio.run(run_clients(server.base_url, ns, vocab))
        finally:
            server.stop()
        r = report["runs"][name]
        print(f"{name:9s} wall {r['wall_s']:7.2f} s  out {r['output_tok_s']:8.1f} tok/s  "
              f"hit {r['cache_hit_rate']:.2f}  median TTFT {r['median_ttft_ms']:8.1f} ms  per turn: "
              + ", ".join(f"t{t['turn']} {t['mean_prompt_tokens']:.0f} tok {t['median_ttft_ms']:.0f} ms"
                          for t in r["per_turn"]), flush=True)
    if ns.out:
        Path(ns.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
