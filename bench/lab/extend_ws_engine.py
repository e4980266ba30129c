"""Prefill through the Engine with the Gluon extend kernel on and off (RADIXRT_EXTEND_WS), each in a
process of its own, alternated: dummy Qwen2.5-7B, chunked prefill 8,192. Workloads, each timed
end to end as generate() with max_new_tokens 1 (so the pass is prefill plus one sampled token):
  - "8 x 8K": 8 prompts of 8,192 random token ids (fresh ids per round: no cache hits);
  - "8 x 4K on a 4K prefix": 8 prompts sharing a 4,096-token prefix cached by a warm-up request,
    each with 4,096 tokens of its own (the extend reads the prefix from the pool page by page).
Prints prefill tokens/s per workload and round.

    python3 bench/lab/extend_ws_engine.py [--rounds 2] [--out extend-ws-engine.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child() -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    from radixrt import Engine

    engine = Engine(model_path=str(ROOT / "bench/configs/qwen2.5-7b-instruct"), load_format="dummy",
                    device="cuda", chunked_prefill_size=8192, max_running_requests=64)
    vocab = int(engine.info["vocab_size"])
    gen = torch.Generator().manual_seed(int(os.environ.get("SEED", "0")))

    def ids(n):
        return torch.randint(100, vocab - 100, (n,), generator=gen).tolist()

    params = {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}
    engine.generate([ids(512)], params)  # warm-up: compiles
    out = {}
    t = time.perf_counter()
    engine.generate([ids(8192) for _ in range(8)], params)
    out["8 x 8K"] = 8 * 8192 / (time.perf_counter() - t)
    prefix = ids(4096)
    engine.generate([prefix + ids(16)], params)  # caches the prefix
    prompts = [prefix + ids(4096) for _ in range(8)]
    t = time.perf_counter()
    res = engine.generate(prompts, params)
    out["8 x 4K on a 4K prefix"] = 8 * 4096 / (time.perf_counter() - t)
    out["cached tokens"] = sum(r["meta_info"]["cached_tokens"] for r in res)
    print("RESULT " + json.dumps(out), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="extend-ws-engine.json")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        child()
        return 0
    rows = []
    for r in range(args.rounds):
        for ws in ("1", "0"):
            env = {**os.environ, "RADIXRT_EXTEND_WS": ws, "SEED": str(r)}
            proc = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True,
                                  text=True, timeout=400)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            row = {"round": r, "extend_ws": ws, **(json.loads(line[0][7:]) if line else
                                                   {"error": (proc.stdout + proc.stderr)[-1500:]})}
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
