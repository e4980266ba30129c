"""One-call engine benchmark for a lent GPU: decode-step latency and offline workload throughput.

Runs, in one process and one `radixrt.Engine` (dummy weights of a real shape):
  1. ceilings: device copy bandwidth and bf16 matmul rate, measured here;
  2. batch-1 decode step (TPOT) with CUDA graphs, against the time to read the weights once;
  3. `random` (input/output lengths), `shared-prefix` and `multi-turn` workloads, the radix cache
     on and off (the same worker, a second scheduler built with the cache disabled), each with its
     output tok/s, cache hit rate and fraction of the roofline (bench/roofline.py).
Results are appended to --out (JSON) after each stage, so a run cut short keeps what it finished.

    python3 bench/gpu_engine.py --model-path bench/configs/qwen2.5-7b-instruct --out $OUT/engine.json
    python3 bench/gpu_engine.py --model-path <dir> --device cpu --small   # smoke test on a CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.offline import run_workload  # noqa: E402
from bench.roofline import Hardware, ModelShape, roofline  # noqa: E402
from bench.workloads import WorkloadSpec  # noqa: E402
from radixrt.engine import Engine  # noqa: E402
from radixrt.scheduler.scheduler_proc import build_scheduler  # noqa: E402


def measure_ceilings(device: str) -> Hardware:
    """Copy bandwidth (bytes read + written per s) and bf16 matmul FLOP/s, medians of CUDA events."""
    if device != "cuda":
        return Hardware(copy_bytes_per_s=1e10, matmul_flops_per_s=1e11)
    from triton.testing import do_bench

    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    dst = torch.empty_like(src)
    copy_ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    src = dst = a = b = None  # free before the engine sizes its KV pool
    torch.cuda.empty_cache()
    return Hardware(copy_bytes_per_s=2 * (1 << 30) * 2 / (copy_ms * 1e-3),
                    matmul_flops_per_s=2 * 8192**3 / (mm_ms * 1e-3))


def decode_step_ms(engine: Engine, prompt_len: int, steps: int) -> float:
    """Batch-1 time per output token after the first (ms), from two runs of different length."""
    prompt = [[1000 + i for i in range(prompt_len)]]

    def run(n: int) -> float:
        t = time.perf_counter()
        engine.generate(prompt, {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True})
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - t

    run(4)  # warm-up: kernels compiled, graphs already captured
    engine.scheduler.flush_cache()
    t1 = run(1)
    engine.scheduler.flush_cache()
    tn = run(steps + 1)
    engine.scheduler.flush_cache()
    return (tn - t1) / steps * 1e3


def workloads(small: bool, vocab: int) -> list[WorkloadSpec]:
    lo = min(1000, vocab // 2)
    if small:
        return [WorkloadSpec(name="random", num_prompts=8, input_len=64, output_len=8, vocab_size=vocab, min_token_id=lo),
                WorkloadSpec(name="shared-prefix", prompts_per_group=8, system_prompt_len=128, question_len=16,
                             output_len=8, vocab_size=vocab, min_token_id=lo),
                WorkloadSpec(name="multi-turn", num_clients=2, num_turns=3, input_len=64, turn_len=16,
                             output_len=8, vocab_size=vocab, min_token_id=lo)]
    return [WorkloadSpec(name="random", num_prompts=256, input_len=512, output_len=256, vocab_size=vocab),
            WorkloadSpec(name="shared-prefix", num_groups=1, prompts_per_group=128, system_prompt_len=2048,
                         question_len=128, output_len=64, vocab_size=vocab),
            WorkloadSpec(name="multi-turn", num_clients=16, num_turns=4, input_len=1024, turn_len=128,
                         output_len=64, vocab_size=vocab)]


def bench_workload(engine: Engine, spec: WorkloadSpec, cache_on: bool, shape: ModelShape,
                   hw: Hardware) -> dict[str, Any]:
    args = dataclasses.replace(engine.args, disable_radix_cache=not cache_on)
    engine.scheduler = build_scheduler(args, engine.info)  # same worker, fresh tree
    res = run_workload(engine, spec.build())
    reuse = "compute" if cache_on else "none"
    bound = roofline(shape, hw, spec.build(), reuse)
    res.update(cache_on=cache_on, roofline=bound,
               fraction_of_roofline=bound["total_s"] / res["wall_s"] if "total_s" in bound else None)
    res.pop("kv_stats", None)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default="bench/configs/qwen2.5-7b-instruct")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="tiny workloads (CPU smoke test)")
    p.add_argument("--only", default="random,shared-prefix,multi-turn")
    p.add_argument("--out", default="engine.json")
    ns = p.parse_args(argv)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name() if ns.device == "cuda" else "cpu",
                              "torch": torch.__version__, "model_path": ns.model_path, "results": []}

    def save() -> None:
        Path(ns.out).write_text(json.dumps(report, indent=1, default=str))

    hw = measure_ceilings(ns.device)
    report["ceilings"] = {"copy_bytes_per_s": hw.copy_bytes_per_s, "matmul_flops_per_s": hw.matmul_flops_per_s}
    t = time.perf_counter()
    engine = Engine(model_path=ns.model_path, load_format=ns.load_format, device=ns.device,
                    max_running_requests=256, chunked_prefill_size=8192, cuda_graph_max_bs=256,
                    max_total_tokens=None if ns.device == "cuda" else 65536)
    report["engine_start_s"] = time.perf_counter() - t
    report["worker_info"] = engine.info
    save()
    shape = ModelShape.from_config(Path(engine.model_dir) / "config.json")
    weight_bytes = sum(p.numel() * p.element_size() for n, p in engine.runner.model.named_parameters()
                       if "embed_tokens" not in n)
    step = decode_step_ms(engine, 128, 16 if ns.small else 128)
    report["decode_b1"] = {"ms_per_token": step, "weight_bytes": weight_bytes,
                           "weights_read_ms": weight_bytes / hw.copy_bytes_per_s * 1e3}
    print(f"batch-1 decode: {step:.2f} ms/token; weights once at copy bandwidth: "
          f"{report['decode_b1']['weights_read_ms']:.2f} ms", flush=True)
    save()
    for spec in workloads(ns.small, int(engine.info["vocab_size"])):
        if spec.name not in ns.only.split(","):
            continue
        for cache_on in (True, False) if spec.name != "random" else (True,):
            r = bench_workload(engine, spec, cache_on, shape, hw)
            report["results"].append(r)
            save()
            print(f"{spec.name:14s} cache={'on ' if cache_on else 'off'} {r['wall_s']:7.2f} s "
                  f"{r['output_throughput']:9.0f} out tok/s  hit {r['cache_hit_rate']:.2f}  "
                  f"roofline {r.get('fraction_of_roofline') or 0:.2f}  ok={r['token_counts_consistent']}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
