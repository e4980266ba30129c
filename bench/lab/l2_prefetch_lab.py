"""Weights prefetched into L2 while other kernels run: does a decode GEMV then read them faster?

    python3 bench/lab/l2_prefetch_lab.py [--out F]     # H200, ~1 min

The batch-1 decode step reads its weights at ~4 TB/s only inside the linears; between them, ~15 us
per layer of small kernels (norms, rotary, K/V store, attention, SiLU) leave the DRAM mostly idle
(docs/benchmarks.md, "The batch-1 decode step kernel by kernel"). If a kernel on a second stream
streamed the next linear's weights into L2 during that time, the linear would read (some of) them
from L2. This lab measures the premise, nothing of the engine: per weight (Qwen2.5-7B's o and gate_up
at M = 1, FP8 through the int GEMV and bf16 through the skinny GEMV), one CUDA graph of

    [L2 flushed by a 256 MB write] -> busy (a few programs spinning ~BUSY_US) -> the GEMV
    with a second stream forked after the flush: prefetch(the first P bytes of the weight)

and the same graph without the prefetch branch, and with the GEMV alone; us, median of CUDA events
around graph replays. `prefetch` loads the bytes with an L2 evict_last hint and keeps nothing (a
xor of the words, stored only if it equals an impossible value). Also reported: the prefetch
kernel alone (its bandwidth) and the GEMV run twice back to back (second read from L2 where it fits).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import run_header  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
from radixrt.kernels import gemv as G  # noqa: E402
from radixrt.kernels import gemv_fp8_int as G8  # noqa: E402
from radixrt.kernels import pdl as PDL  # noqa: E402
from radixrt.models.quant.fp8 import quantize_per_channel  # noqa: E402

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


@triton.jit
def _prefetch_kernel(src, dummy, n_words, WORDS: tl.constexpr, EVICT_LAST: tl.constexpr):
    """Load words [pid * WORDS, (pid + 1) * WORDS) of src (int32) with an L2 evict_last hint (or
    evict_first); the xor is stored only when it equals a value it cannot take here (dummy stays)."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * WORDS + tl.arange(0, WORDS)
    if EVICT_LAST:
        v = tl.load(src + offs, mask=offs < n_words, other=0, eviction_policy="evict_last")
    else:
        v = tl.load(src + offs, mask=offs < n_words, other=0, eviction_policy="evict_first")
    x = tl.xor_sum(v, axis=0)
    tl.store(dummy + pid, x, mask=x == 0x7EADBEEF)


@triton.jit
def _busy_kernel(out, iters):
    """A few programs doing dependent FMAs for `iters` steps (the small kernels' time, no DRAM)."""
    acc = tl.zeros([128], dtype=tl.float32) + tl.program_id(0)
    for _ in range(iters):
        acc = acc * 0.999 + 1.0
    tl.store(out + tl.program_id(0) * 128 + tl.arange(0, 128), acc)


def prefetch(w: torch.Tensor, nbytes: int, dummy: torch.Tensor, words: int = 4096, evict_last: bool = True):
    w32 = w.view(torch.int32).view(-1)
    n = min(w32.numel(), nbytes // 4)
    _prefetch_kernel[(triton.cdiv(n, words),)](w32, dummy, n, WORDS=words, EVICT_LAST=evict_last,
                                               num_warps=4)


def graph_us(fn, flush: torch.Tensor, reps: int = 30) -> float:
    """Median us of one replay of a graph holding fn (after the flush write), minus the flush alone."""
    def timed(body) -> float:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        for _ in range(3):
            g.replay()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        return sorted(ts)[len(ts) // 2]

    def with_fn() -> None:
        flush.fill_(1)
        fn()

    return timed(with_fn) - timed(lambda: flush.fill_(1))


_SIDE: list = []


def _side_stream() -> torch.cuda.Stream:
    if not _SIDE:
        _SIDE.append(torch.cuda.Stream())
    return _SIDE[0]


def scenario(gemv, w, busy_iters: int, pre_bytes: int, dummy, busy_out, flush, evict_last: bool = True):
    """busy -> gemv on the main stream; prefetch(pre_bytes of w) on a side stream forked at the start
    (pre_bytes 0: no side stream)."""
    side = _side_stream()

    def run() -> None:
        main = torch.cuda.current_stream()
        if pre_bytes:
            side.wait_stream(main)
            with torch.cuda.stream(side):
                prefetch(w, pre_bytes, dummy, evict_last=evict_last)
        if busy_iters:
            _busy_kernel[(4,)](busy_out, busy_iters, num_warps=4)
        if pre_bytes:
            main.wait_stream(side)
        gemv()
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "l2_prefetch.json"))
    ap.add_argument("--busy-iters", type=int, default=5000)
    args = ap.parse_args()
    PDL.enabled = False
    dev = torch.device("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    dummy = torch.zeros(1 << 20, dtype=torch.int32, device=dev)
    busy_out = torch.empty(4 * 128, dtype=torch.float32, device=dev)
    report: dict = {"header": run_header(), "rows": []}
    busy = graph_us(lambda: _busy_kernel[(4,)](busy_out, args.busy_iters, num_warps=4), flush)
    log(f"busy kernel alone: {busy:.1f} us")
    report["busy_us"] = busy
    shapes = {"o": (3584, 3584), "gate_up": (37888, 3584)}
    for name, (n, k) in shapes.items():
        w16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        w8, s8 = quantize_per_channel(w16)
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        y = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
        cfg8 = G8.fp8_int_config(1, n, k)
        c16 = G.default_config(1, n, k, torch.cuda.get_device_properties(dev).multi_processor_count)
        ws = G.SkinnyWorkspace.allocate(16 * 16 * n, n, dev)
        forms = {"fp8": (partial(G8.fp8_int_gemv, x, w8, s8, None, y, cfg8.block_n, cfg8.block_k4, 1, 4), w8),
                 "bf16": (partial(G.skinny_linear, x, w16, out=y, config=c16, workspace=ws), w16)}
        for form, (gemv, w) in forms.items():
            nbytes = w.numel() * w.element_size()
            gemv()
            row: dict = {"shape": name, "form": form, "mb": nbytes / 1e6}
            row["gemv"] = graph_us(gemv, flush)
            row["gemv_twice"] = graph_us(lambda g=gemv: (g(), g()), flush) - row["gemv"]
            row["busy+gemv"] = graph_us(scenario(gemv, w, args.busy_iters, 0, dummy, busy_out, flush), flush)
            for mb in (8, 16, 24, 32, 48):
                pre = min(nbytes, mb << 20)
                key = f"pre{mb}MB"
                row[key + "_alone"] = graph_us(lambda p=pre, w=w: prefetch(w, p, dummy), flush)
                row[key] = graph_us(scenario(gemv, w, args.busy_iters, pre, dummy, busy_out, flush), flush)
                row[key + "_first"] = graph_us(
                    scenario(gemv, w, args.busy_iters, pre, dummy, busy_out, flush, evict_last=False), flush)
                if pre == nbytes:
                    break
            log(f"{name} {form}: " + ", ".join(f"{kk} {v:.1f}" if isinstance(v, float) else f"{kk} {v}"
                                             for kk, v in row.items()))
            report["rows"].append(row)
            Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print("\n| shape | form | MB | GEMV | GEMV again (L2) | busy + GEMV | busy + GEMV, prefetch 8 / 16 / 24 /"
          " 32 / 48 MB (evict_last) | same, evict_first | prefetch alone 8 / 16 / ... |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in report["rows"]:
        pre = [k for k in r if k.startswith("pre") and k.endswith("MB")]
        print(f"| {r['shape']} | {r['form']} | {r['mb']:.1f} | {r['gemv']:.1f} | {r['gemv_twice']:.1f} | "
              f"{r['busy+gemv']:.1f} | " + " / ".join(f"{r[k]:.1f}" for k in pre) + " | "
              + " / ".join(f"{r[k + '_first']:.1f}" for k in pre) + " | "
              + " / ".join(f"{r[k + '_alone']:.1f}" for k in pre) + " |")
    print(f"(us; busy kernel alone {busy:.1f} us; L2 flushed before each replay)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
