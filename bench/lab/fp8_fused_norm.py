"""The RMSNorm split across the FP8 int GEMVs around it (kernels/gemv_fp8_int.py NORM_OUT / NORM_IN,
models/quant/fp8.py NormedAct) against the norm as its own kernel, at batch-1 decode (issue 19).

    python3 bench/lab/fp8_fused_norm.py [--rounds 4] [--out F]     # H200, ~4 min

1. Kernel chains at Qwen2.5-7B's shapes, M = 1, PDL as the engine launches them: 28 copies of
   (o -> residual add + RMSNorm -> gate_up -> SiLU-and-mul) and of (down -> RMSNorm -> qkv), each a CUDA graph
   over its own weights (4.2 / 2.3 GB: no L2 reuse between replays); us per chain, median of graph
   replays, unfused (three kernels) against fused (two; the next linear reads every program's
   partial sum of squares, or one per row summed by the producer's last program: SQ_LAST; or, for
   gate_up, the plain GEMV and the SiLU-and-mul applying rstd, the engine's form). The
   fused chain's output is checked against the unfused one first (relative error), and its
   residual stream bit for bit.
2. The batch-1 decode step of five Engines kept alive in one process (dummy Qwen2.5-7B, 128-token
   prompt, bench/gpu_engine.py decode_step_ms) in alternated rounds: bf16, FP8 with the norms as
   kernels (RADIXRT_FP8_FUSED_NORM=0's form), FP8 with them fused (the default), fused with
   SQ_LAST (Fp8Linear.norm_sq_last), and fused with gate_up's rstd in its GEMV's epilogue instead of
   the SiLU (Fp8Linear.norm_in_silu False). Greedy tokens of the FP8 engines are compared (they can
   differ: rstd is applied after the dot products).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import graph_ms, rel_err, run_header, write_json  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
from radixrt.kernels import gemv_fp8_int as G8  # noqa: E402
from radixrt.kernels import norm as N  # noqa: E402
from radixrt.models.quant.fp8 import Fp8Linear, quantize_per_channel  # noqa: E402

T0 = time.time()
H, INTER, QKV = 3584, 18944, 4608
LAYERS = 28


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


def _weights(n: int, k: int, copies: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for _ in range(copies):
        w8, s = quantize_per_channel(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
        out.append((w8, s))
    return out


def _replays_ms(replay, replays: int = 20) -> float:
    """Median ms of one call of `replay` (a graph's replay) over `replays` CUDA-event timings, after 3
    warm-up calls; no L2 flush (each graph reads GBs of its own weights)."""
    for _ in range(3):
        replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _graph_us(fn) -> float:
    """us of one replay of a CUDA graph of fn() (bench.common.graph_ms with `_replays_ms`)."""
    return graph_ms(fn, timer=_replays_ms) * 1e3


def _chain(name: str, n1: int, k1: int, n2: int, k2: int, silu: bool, eps: float = 1e-6) -> dict:
    """One chain's figures (module docstring, part 1); silu: the second linear is gate_up, followed
    by the SiLU-and-mul in every form, and one more fused form applies rstd in the SiLU."""
    from radixrt.kernels.activation import silu_and_mul

    w1s, w2s = _weights(n1, k1, LAYERS), _weights(n2, k2, LAYERS)
    gamma = (torch.rand(n1, device="cuda") + 0.5).to(torch.bfloat16)
    x = torch.randn(1, k1, device="cuda", dtype=torch.bfloat16)
    resid = torch.randn(1, n1, device="cuda", dtype=torch.bfloat16)
    counters = torch.zeros(1, dtype=torch.int32, device="cuda")
    act = silu_and_mul if silu else (lambda y: y)

    def unfused(layers: int = LAYERS):
        out = None
        for (w1, s1), (w2, s2) in zip(w1s[:layers], w2s[:layers], strict=True):
            y = G8.fp8_skinny_linear(x, w1, s1)
            xn, h = N.rms_norm(y, gamma, eps, resid)
            out = (act(G8.fp8_skinny_linear(xn, w2, s2)), h)
        return out

    def fused(layers: int = LAYERS, last: bool = False):
        out = None
        for (w1, s1), (w2, s2) in zip(w1s[:layers], w2s[:layers], strict=True):
            g, h, sq = G8.fp8_int_gemv_norm_out(x, w1, s1, None, resid, gamma,
                                                counters=counters if last else None)
            out = (act(G8.fp8_int_gemv_norm_in(g, sq, eps, w2, s2)), h)
        return out

    def fused_silu(layers: int = LAYERS):
        out = None
        for (w1, s1), (w2, s2) in zip(w1s[:layers], w2s[:layers], strict=True):
            g, h, sq = G8.fp8_int_gemv_norm_out(x, w1, s1, None, resid, gamma)
            out = (silu_and_mul(G8.fp8_skinny_linear(g, w2, s2), rms=(sq, eps, n1)), h)
        return out

    forms = {"unfused": unfused, "fused": fused, "fused, last program's sum": lambda n=LAYERS: fused(n, True)}
    if silu:
        forms["fused, rstd in the SiLU"] = fused_silu
    ref, ref_h = unfused(1)
    res = {}
    for form, fn in forms.items():
        y, h = fn(1)
        res[form] = {"us": _graph_us(fn) / LAYERS, "rel_err": rel_err(y, ref),
                     "residual_bit_equal": torch.equal(h, ref_h)}
    log(f"{name}: " + ", ".join(f"{f} {r['us']:.2f} us (rel err {r['rel_err']:.1e}, residual equal "
                                f"{r['residual_bit_equal']})" for f, r in res.items())
        + f"; counter {int(counters[0])}")
    return res


def kernel_chains() -> dict:
    res = {"o -> norm -> gate_up -> silu": _chain("o -> norm -> gate_up -> silu", H, H, 2 * INTER, H, True),
           "down -> norm -> qkv": _chain("down -> norm -> qkv", H, INTER, QKV, H, False)}
    torch.cuda.empty_cache()
    return res


def engines(rounds: int) -> dict:
    from bench.fp8_bench import model_dir
    from bench.gpu_engine import decode_step_ms
    from radixrt.engine import Engine

    path = model_dir("qwen2.5-7b")
    # (name, quantization, fused_norm, norm_sq_last, norm_in_silu)
    variants = [("bf16", None, False, False, True), ("fp8 norms as kernels", "fp8", False, False, True),
                ("fp8 fused norms", "fp8", True, False, True),
                ("fp8 fused norms, gate_up's rstd in its GEMV", "fp8", True, False, False),
                ("fp8 fused norms, last sums", "fp8", True, True, True)]
    prompt = [[1000 + i for i in range(128)]]
    engs, out = {}, {}
    for name, quant, fused, last, in_silu in variants:
        Fp8Linear.fused_norm, Fp8Linear.norm_sq_last, Fp8Linear.norm_in_silu = fused, last, in_silu
        kw = {"quantization": quant} if quant else {}
        t = time.perf_counter()
        engs[name] = Engine(model_path=str(path), load_format="dummy", device="cuda", max_running_requests=16,
                            cuda_graph_max_bs=8, max_total_tokens=8192, chunked_prefill_size=8192, **kw)
        tokens = engs[name].generate(prompt, {"temperature": 0.0, "max_new_tokens": 32,
                                              "ignore_eos": True})[0]["output_ids"]
        out[name] = {"start_s": time.perf_counter() - t, "steps_ms": [], "tokens": tokens}
        log(f"engine {name} started in {out[name]['start_s']:.0f} s")
    for r in range(rounds):
        for name, _, fused, last, in_silu in variants:
            Fp8Linear.fused_norm, Fp8Linear.norm_sq_last, Fp8Linear.norm_in_silu = fused, last, in_silu
            out[name]["steps_ms"].append(decode_step_ms(engs[name], 128, 128))
        log(f"round {r}: " + ", ".join(f"{n} {out[n]['steps_ms'][-1]:.3f}" for n in out))
    base = statistics.median(out["bf16"]["steps_ms"])
    print("\n| engine | rounds (ms) | median | / bf16 |")
    print("|---|---|---|---|")
    for name in out:
        e = out[name]
        e["median_ms"] = med = statistics.median(e["steps_ms"])
        print(f"| {name} | {', '.join(f'{x:.3f}' for x in e['steps_ms'])} | {med:.3f} | {med / base:.3f} |")
    same = out["fp8 fused norms"]["tokens"] == out["fp8 norms as kernels"]["tokens"]
    same_last = out["fp8 fused norms"]["tokens"] == out["fp8 fused norms, last sums"]["tokens"]
    same_gemv = (out["fp8 fused norms"]["tokens"]
                 == out["fp8 fused norms, gate_up's rstd in its GEMV"]["tokens"])
    print(f"greedy tokens: fused = norms as kernels {same}; fused, last sums = fused {same_last}; "
          f"gate_up's rstd in its GEMV = fused {same_gemv}")
    out["fp8_tokens_equal"], out["fp8_last_tokens_equal"] = same, same_last
    for e in out.values():
        if isinstance(e, dict):
            e.pop("tokens", None)
    del engs
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("fp8_fused_norm needs a CUDA device")
    result = {"header": run_header()}
    if not args.skip_kernels:
        result["chains"] = kernel_chains()
    result["engines"] = engines(args.rounds)
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
