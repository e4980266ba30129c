"""Device ceilings that read as high as the card goes: the best of several methods, warm clocks.

A ceiling measured low flatters every fraction reported against it (issue 19: one run measured the
bf16 matmul rate at 687 TFLOP/s where the same card type gave 769-798 elsewhere). So each ceiling is
the HIGHEST of several methods, each timed as the mean of `reps` (10) back-to-back calls after a
warm-up, best of `trials` (3) such means, after the clocks were warmed by ~1 s of matmuls:
  matmul : 8192^3 bf16 on random data, as torch.matmul (A @ B), A @ B^T (F.linear's layout), A^T @ B,
           and torch.mm into a preallocated output;
  copy   : bytes read + written per s of a `copy_gib` GiB bf16 copy, as Tensor.copy_ (cudaMemcpy) and
           as a Triton kernel of 16-byte accesses; read-only (torch.sum) reported beside, not used.
Returns the keys of bench.common.measure_ceilings (copy_bytes_per_s, copy_ms, matmul_flops_per_s,
matmul_ms) plus "methods" (every method's rate) and "how".
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def mean_ms(fn: Callable[[], object], reps: int = 10, warmup: int = 5, trials: int = 3) -> float:
    """Best over `trials` of the mean time of `reps` back-to-back fn() calls (CUDA events), after
    `warmup` calls; ms."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best


def warm_clocks(a: torch.Tensor, b: torch.Tensor, seconds: float = 1.0) -> None:
    """Run matmuls for about `seconds` so that the SM clocks are at their sustained level."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()


def matmul_methods(m: int = 8192) -> dict[str, float]:
    """FLOP/s of an m^3 bf16 matmul by each method (random data)."""
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    bt, at = b.t().contiguous(), a.t().contiguous()
    out = torch.empty(m, m, device="cuda", dtype=torch.bfloat16)
    warm_clocks(a, b)
    flops = 2.0 * m**3
    methods = {"matmul A@B": lambda: a @ b, "linear A@B^T": lambda: torch.nn.functional.linear(a, bt),
               "A^T@B": lambda: at.t() @ b, "mm out=": lambda: torch.mm(a, b, out=out)}
    return {name: flops / (mean_ms(fn) * 1e-3) for name, fn in methods.items()}


def copy_methods(copy_gib: float = 4) -> dict[str, float]:
    """Bytes (read + written) per s of a copy_gib GiB copy by each method; "read-only sum" is the
    bytes read per s of torch.sum (reported, not a copy)."""
    n = int(copy_gib * (1 << 30)) // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    block = 8192

    def triton_copy():
        _copy_kernel[(triton.cdiv(n, block),)](src, dst, n, BLOCK=block, num_warps=8)

    res = {"copy_": 4.0 * n / (mean_ms(lambda: dst.copy_(src)) * 1e-3),
           "triton copy": 4.0 * n / (mean_ms(triton_copy) * 1e-3)}
    res["read-only sum"] = 2.0 * n / (mean_ms(lambda: src.sum()) * 1e-3)
    return res


def measure_best_ceilings(copy_gib: float = 4, m: int = 8192) -> dict:
    """The best copy bandwidth and bf16 matmul rate of the methods above (see the module docstring);
    buffers are freed before return."""
    mm = matmul_methods(m)
    cp = copy_methods(copy_gib)
    torch.cuda.empty_cache()
    mm_best = max(mm.values())
    cp_best = max(v for k, v in cp.items() if k != "read-only sum")
    return {"copy_bytes_per_s": cp_best, "copy_ms": 4.0 * (int(copy_gib * (1 << 30)) // 2) / cp_best * 1e3,
            "matmul_flops_per_s": mm_best, "matmul_ms": 2.0 * m**3 / mm_best * 1e3,
            "methods": {"matmul_flops_per_s": mm, "copy_bytes_per_s": cp},
            "how": f"best of methods; mean of 10 after 5 warm-up calls, best of 3; clocks warmed 1 s; "
                   f"{m}^3 bf16 random, {copy_gib} GiB copy"}
