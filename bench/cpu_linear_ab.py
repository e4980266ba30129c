"""CPU decode with and without oneDNN packed weights for the linears, A/B in one process.

    python3 bench/cpu_linear_ab.py [--batch-sizes 1,4,16] [--repeat 4] [--out FILE.json]

The offline Engine on the default model (float32, one torch thread like a server on a 2-core
machine), random prompts of --prompt-len tokens. For each batch size and each mode
(`Linear._cpu_packed` False / True, alternating for --repeat rounds), fresh prompts are run once
for 1 output token and once for 1 + --decode-tokens; the difference over --decode-tokens is the
time per decode step (TPOT), in CPU time of this thread (`time.thread_time`), which a machine
shared with other jobs inflates less than wall time. Prints medians and the packed / F.linear
ratio, and the share of greedy tokens equal in both modes on the same prompts.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch


def _prompts(rng: random.Random, n: int, length: int) -> list[list[int]]:
    return [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--out")
    ns = ap.parse_args()
    from radixrt import Engine
    from radixrt.models.linear import Linear

    eng = Engine(model_path=None, max_total_tokens=32768, device="cpu")
    torch.set_num_threads(1)
    rng = random.Random(0)
    sp = {"temperature": 0, "ignore_eos": True}
    eng.generate(_prompts(rng, 4, ns.prompt_len), {**sp, "max_new_tokens": 4})  # warm-up
    tpot: dict[str, list[float]] = {}
    same = total = 0
    for _ in range(ns.repeat):
        for bs in (int(b) for b in ns.batch_sizes.split(",")):
            check = _prompts(rng, bs, ns.prompt_len)
            outs = {}
            for packed in (False, True):
                Linear._cpu_packed = packed
                t0 = time.thread_time()
                eng.generate(_prompts(rng, bs, ns.prompt_len), {**sp, "max_new_tokens": 1})
                t1 = time.thread_time()
                eng.generate(_prompts(rng, bs, ns.prompt_len), {**sp, "max_new_tokens": 1 + ns.decode_tokens})
                t2 = time.thread_time()
                tpot.setdefault(f"{bs}/{packed}", []).append(((t2 - t1) - (t1 - t0)) / ns.decode_tokens * 1e3)
                outs[packed] = [o["output_ids"] for o in eng.generate(check, {**sp, "max_new_tokens": 8})]
            for a, b in zip(outs[False], outs[True], strict=True):
                same += sum(x == y for x, y in zip(a, b, strict=False))
                total += len(a)
    rows = {}
    print("| batch | F.linear TPOT ms | packed TPOT ms | packed / F.linear |")
    print("|---|---|---|---|")
    for bs in ns.batch_sizes.split(","):
        a, b = statistics.median(tpot[f"{bs}/False"]), statistics.median(tpot[f"{bs}/True"])
        rows[bs] = {"f_linear_ms": tpot[f"{bs}/False"], "packed_ms": tpot[f"{bs}/True"], "ratio": b / a}
        print(f"| {bs} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    print(f"greedy tokens equal in both modes: {same} / {total}")
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump({"rows": rows, "same_tokens": same, "tokens": total, "args": vars(ns)}, f, indent=1)


if __name__ == "__main__":
    main()
