"""Upper bounds for fusions at the batch-1 decode step (issue 19: FP8 step at most 0.6x bf16's): the
step of Engines whose graphs leave out a kernel, against the same Engines whole (timing only: the
engines without a kernel compute wrong tokens).

    python3 bench/lab/fp8_step_without.py [--rounds 4] [--variants "fp8;fp8 two kernels"] [--out F]  # ~2 min

Engines on the dummy Qwen2.5-7B kept alive in one process, 128-token prompt, the batch-1 step of
bench/gpu_engine.py decode_step_ms in alternated rounds (median):
  - bf16 and FP8 as they are;
  - "no rotary": models/ops.apply_rotary returns q and k unrotated (the kernel is not launched);
  - "no rotary, no K/V store": also worker/attention_triton.store_kv does nothing, the bound of a
    qkv GEMV whose epilogue rotates q / k and writes K / V into the pool;
  - "two kernels": the rotary and K/V-store kernels apart (RADIXRT_ROPE_STORE=0 while the engine is
    built) instead of the fused rope_store_kv: what the fusion gains in the step (exact);
  - "short class 256": the decode graphs' shortest length class 256 instead of 1,024
    (worker/cuda_graph.SHORTEST_LEN_CLASS), so a batch-1 step over <= 256 tokens runs one KV split
    that writes the output directly: no merge kernel (exact; the bound of dropping the merge there).
Each is captured with the change in place and restored after.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import out_path, run_header, write_json  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


@contextlib.contextmanager
def patched(no_rotary: bool = False, no_store: bool = False, shortest: int | None = None,
            two_kernels: bool = False):
    from radixrt.models import ops
    from radixrt.worker import attention_triton as at
    from radixrt.worker import cuda_graph as cg

    # the Triton backend rotates and stores in one kernel (rope_store_kv, forward_rope): each switch
    # replaces it by the part that stays
    saved = (ops.apply_rotary, at.store_kv, at.rope_store_kv, cg.SHORTEST_LEN_CLASS)

    def store_only(q, k, v, positions, cache, k_buffer, v_buffer, loc, **scales):
        at.store_kv(k_buffer, v_buffer, loc, k, v, **scales)

    def rotary_only(q, k, v, positions, cache, *pool_args, **scales):
        ops.apply_rotary(q, k, positions, cache)

    if no_rotary:
        ops.apply_rotary = lambda q, k, positions, cache: (q, k)
    if no_store:
        at.store_kv = lambda *a, **kw: None
    if no_rotary and no_store:
        at.rope_store_kv = lambda *a, **kw: None
    elif no_rotary:
        at.rope_store_kv = store_only
    elif no_store:
        at.rope_store_kv = rotary_only
    if shortest is not None:
        cg.SHORTEST_LEN_CLASS = shortest
    saved_env = os.environ.get("RADIXRT_ROPE_STORE")
    if two_kernels:  # read when the attention backend is built (worker/attention_triton.py)
        os.environ["RADIXRT_ROPE_STORE"] = "0"
    try:
        yield
    finally:
        ops.apply_rotary, at.store_kv, at.rope_store_kv, cg.SHORTEST_LEN_CLASS = saved
        if two_kernels:
            os.environ.pop("RADIXRT_ROPE_STORE", None)
            if saved_env is not None:
                os.environ["RADIXRT_ROPE_STORE"] = saved_env


VARIANTS = [  # (name, quantization, patch kwargs)
    ("bf16", None, {}), ("fp8", "fp8", {}),
    ("bf16 two kernels", None, {"two_kernels": True}), ("fp8 two kernels", "fp8", {"two_kernels": True}),
    ("fp8 no rotary", "fp8", {"no_rotary": True}),
    ("fp8 no rotary, no K/V store", "fp8", {"no_rotary": True, "no_store": True}),
    ("bf16 no rotary, no K/V store", None, {"no_rotary": True, "no_store": True}),
    ("fp8 short class 256", "fp8", {"shortest": 256}),
    ("bf16 short class 256", None, {"shortest": 256}),
    ("fp8 all three", "fp8", {"no_rotary": True, "no_store": True, "shortest": 256}),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--variants", default=None,
                    help="semicolon-separated names of VARIANTS to run (default all; bf16 always runs)")
    ap.add_argument("--out", default=None)
    ns = ap.parse_args()
    variants = VARIANTS
    if ns.variants:
        wanted = {"bf16", *(v.strip() for v in ns.variants.split(";"))}
        unknown = wanted - {name for name, _, _ in VARIANTS}
        if unknown:
            sys.exit(f"unknown variants {sorted(unknown)}; known: {[name for name, _, _ in VARIANTS]}")
        variants = [v for v in VARIANTS if v[0] in wanted]
    if not torch.cuda.is_available():
        sys.exit("fp8_step_without needs a CUDA device")
    from bench.fp8_bench import model_dir
    from bench.gpu_engine import decode_step_ms
    from radixrt.engine import Engine

    path = model_dir("qwen2.5-7b")
    engs, out = {}, {}
    for name, quant, patch in variants:
        kw = {"quantization": quant} if quant else {}
        t = time.perf_counter()
        with patched(**patch):
            engs[name] = Engine(model_path=str(path), load_format="dummy", device="cuda",
                                max_running_requests=16, cuda_graph_max_bs=8, max_total_tokens=8192,
                                chunked_prefill_size=8192, **kw)
        out[name] = {"start_s": time.perf_counter() - t, "steps_ms": []}
        log(f"engine {name} started in {out[name]['start_s']:.0f} s")
    for r in range(ns.rounds):
        for name, _, patch in variants:
            with patched(**patch):  # eager passes (prefill) see the same change as the graphs
                out[name]["steps_ms"].append(decode_step_ms(engs[name], 128, 128))
        log(f"round {r}: " + ", ".join(f"{n} {out[n]['steps_ms'][-1]:.3f}" for n in out))
    base = statistics.median(out["bf16"]["steps_ms"])
    print("\n| engine | rounds (ms) | median | / bf16 | / bf16 of the same change |")
    print("|---|---|---|---|---|")
    for e in out.values():
        e["median_ms"] = statistics.median(e["steps_ms"])
    for name in out:
        e = out[name]
        med = e["median_ms"]
        twin = "bf16" + name[3:] if name.startswith("fp8") else None
        rel = f"{med / out[twin]['median_ms']:.3f}" if twin in out else ""
        print(f"| {name} | {', '.join(f'{x:.3f}' for x in e['steps_ms'])} | {med:.3f} | {med / base:.3f} | "
              f"{rel} |")
    write_json(out_path(ns.out, "fp8-step-without.json"), {**run_header(), "engines": out})
    del engs
    gc.collect()
    torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
