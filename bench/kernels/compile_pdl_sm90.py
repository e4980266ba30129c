"""Compile the decode path's kernels with programmatic dependent launch (USE_PDL, kernels/pdl.py) for
an H100/H200 (sm_90) on a machine without a GPU, and check the PTX keeps the PDL contract.

For each kernel: the PTX holds `griddepcontrol.wait` and `griddepcontrol.launch_dependents`, and no
global store or atomic comes before the wait. The GEMVs at M = 1 (bf16 reduce path, FP8 int path)
must also issue their first weight-chunk loads before the wait (what PDL overlaps with the previous
kernel), and the norm its weight load. Prints one ok / FAIL line per kernel; exit status 1 on a failure.

    python3 bench/kernels/compile_pdl_sm90.py
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET=1 (the interpreter does not compile)")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler import compile as triton_compile  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
FLOATS = {"eps", "qk_scale", "v_scale", "k_inv_scale", "v_inv_scale"}


def compile_ptx(module: str, kernel: str, pointers: dict[str, str], const: dict, num_warps: int,
                num_stages: int) -> str:
    """The sm_90 PTX of `kernel` with USE_PDL=True: pointer arguments typed as `pointers` says
    (name -> element type, e.g. "bf16"), other non-constexpr arguments i32 (fp32 for FLOATS);
    pointers and strides carry tt.divisibility 16 as at run time; constexprs not in `const` take
    their defaults."""
    fn = getattr(importlib.import_module(module), kernel)
    defaults = {p.name: p.default for p in fn.params
                if p.is_constexpr and p.default is not inspect.Parameter.empty}
    const = {**defaults, **const, "USE_PDL": True}
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in const:
            sig[n] = "constexpr"
            continue
        sig[n] = f"*{pointers[n]}" if n in pointers else "fp32" if n in FLOATS else "i32"
        if n in pointers or (n.startswith("stride") and n != "stride_pt_b"):  # page-table rows: any width
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
                    attrs=attrs)
    k = triton_compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages,
                                                    "launch_pdl": True})
    return k.asm["ptx"]


def check_ptx(ptx: str, loads_before_wait: bool) -> tuple[bool, str]:
    """(ok, detail): wait and launch_dependents present, no global store / atomic before the wait,
    and (loads_before_wait) at least one global load before it."""
    body = ptx[ptx.index(".entry"):]
    wait = body.find("griddepcontrol.wait")
    trig = body.find("griddepcontrol.launch_dependents")
    if wait < 0 or trig < 0:
        return False, f"griddepcontrol.wait at {wait}, launch_dependents at {trig}"
    head = body[:wait]
    stores = len(re.findall(r"\b(st\.global|atom\.global|red\.global)", head))
    loads = len(re.findall(r"\bld\.global", head))
    ok = stores == 0 and trig > wait and (loads > 0 or not loads_before_wait)
    return ok, f"{loads} global loads and {stores} stores before the wait"


def variants() -> list[tuple[str, str, str, dict, dict, int, int, bool]]:
    """(name, module, kernel, pointer types, constexprs, warps, stages, weight loads before the wait)
    at the Qwen2.5-7B decode shapes."""
    act = {"x": "bf16", "residual": "bf16", "weight": "bf16", "out": "bf16", "new_residual": "bf16"}
    gemv_ptr = {"x": "bf16", "w": "bf16", "w_scale": "fp32", "bias": "bf16", "y": "bf16", "partials": "fp32",
                "counters": "i32"}
    gemv = dict(EVEN_K=True, SPLIT=False, SERIAL_REDUCE=True, HAS_BIAS=False, DOT_PRECISION="tf32",
                HAS_W_SCALE=False, F16_DOT=False, ONE_ROW=False)
    int_ptr = {"x": "i64", "w": "i32", "w_scale": "fp32", "bias": "bf16", "y": "bf16", "partials": "fp32",
               "counters": "i32"}
    dec_ptr = {"q": "bf16", "k_buf": "bf16", "v_buf": "bf16", "page_table": "i32", "seq_lens": "i32",
               "kv_start": "i32", "mid_o": "fp32", "mid_lse": "fp32", "o": "bf16"}
    dec = dict(GROUP=7, PAGE_SIZE=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_H=16, BLOCK_N=128,
               DOT_PRECISION="tf32", KV_DOT="q", HAS_KV_START=False, DIRECT_OUT=False, MERGE_PREFIX=False,
               PREFIX_SLOTS=0)
    return [
        ("rms_norm + residual", "kernels.norm", "_rms_norm_kernel", act,
         dict(N=3584, BLOCK=4096, HAS_RESIDUAL=True), 8, 1, True),
        ("silu_and_mul", "kernels.activation", "_silu_and_mul_kernel", {"x": "bf16", "out": "bf16"},
         dict(BLOCK=1024), 4, 1, False),
        ("rotary", "kernels.rotary", "_rope_kernel",
         {"q": "bf16", "k": "bf16", "positions": "i64", "cos_sin": "fp32"},
         dict(HALF=64, BLOCK_HQ=32, BLOCK_HKV=4, BLOCK_HALF=64), 4, 1, False),
        ("store_kv", "kernels.store_kv", "_store_kv_kernel",
         {"k_buf": "bf16", "v_buf": "bf16", "k_src": "bf16", "v_src": "bf16", "out_cache_loc": "i64"},
         dict(HEAD_DIM=128, BLOCK_H=4, BLOCK_D=128, QUANT=False), 4, 1, False),
        ("rotary + store_kv", "kernels.rotary", "_rope_store_kernel",
         {"q": "bf16", "k": "bf16", "v": "bf16", "positions": "i64", "cos_sin": "fp32", "k_buf": "bf16",
          "v_buf": "bf16", "out_cache_loc": "i64"},
         dict(HALF=64, BLOCK_HQ=32, BLOCK_HKV=4, BLOCK_HALF=64, HEAD_DIM=128, BLOCK_D=128, QUANT=False),
         4, 1, False),
        ("rotary + store_kv, FP8 pool", "kernels.rotary", "_rope_store_kernel",
         {"q": "bf16", "k": "bf16", "v": "bf16", "positions": "i64", "cos_sin": "fp32", "k_buf": "fp8e4nv",
          "v_buf": "fp8e4nv", "out_cache_loc": "i64"},
         dict(HALF=64, BLOCK_HQ=32, BLOCK_HKV=4, BLOCK_HALF=64, HEAD_DIM=128, BLOCK_D=128, QUANT=True),
         4, 1, False),
        ("gemv bf16 M=1 (reduce)", "kernels.gemv", "_skinny_kernel", gemv_ptr,
         dict(gemv, BLOCK_M=1, BLOCK_N=8, BLOCK_K=512, USE_DOT=False), 4, 1, True),
        ("gemv bf16 M=1 split-K (reduce)", "kernels.gemv", "_skinny_kernel", gemv_ptr,
         dict(gemv, BLOCK_M=1, BLOCK_N=8, BLOCK_K=512, USE_DOT=False, SPLIT=True), 4, 1, True),
        ("gemv bf16 M=8 (dot)", "kernels.gemv", "_skinny_kernel", gemv_ptr,
         dict(gemv, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, USE_DOT=True), 4, 4, False),
        ("gemv FP8 int M=1", "kernels.gemv_fp8_int", "_fp8_int_gemv_kernel", int_ptr,
         dict(ROWS=1, BLOCK_M=1, BLOCK_N=4, BLOCK_K4=256, EVEN_K=True, SPLIT=False, HAS_BIAS=False),
         4, 1, True),
        ("gemv FP8 int M=1, prefetch", "kernels.gemv_fp8_int", "_fp8_int_gemv_kernel", int_ptr,
         dict(ROWS=1, BLOCK_M=1, BLOCK_N=4, BLOCK_K4=256, EVEN_K=True, SPLIT=False, HAS_BIAS=False,
              PREFETCH=True), 4, 1, True),
        ("gemv FP8 int M=1, norm out", "kernels.gemv_fp8_int", "_fp8_int_gemv_kernel",
         {**int_ptr, "residual": "bf16", "gamma": "bf16", "new_residual": "bf16", "sq": "fp32"},
         dict(ROWS=1, BLOCK_M=1, BLOCK_N=4, BLOCK_K4=512, EVEN_K=True, SPLIT=False, HAS_BIAS=False,
              NORM_OUT=True), 4, 1, True),
        ("gemv FP8 int M=1, norm in", "kernels.gemv_fp8_int", "_fp8_int_gemv_kernel",
         {**int_ptr, "residual": "bf16", "gamma": "bf16", "new_residual": "bf16", "sq": "fp32"},
         dict(ROWS=1, BLOCK_M=1, BLOCK_N=8, BLOCK_K4=128, EVEN_K=True, SPLIT=False, HAS_BIAS=True,
              NORM_IN=True, BLOCK_P=1024), 4, 1, True),
        ("decode split -> mid", "kernels.decode_attention", "_decode_split_kernel", dec_ptr, dec,
         4, 2, False),
        ("decode one split -> out", "kernels.decode_attention", "_decode_split_kernel", dec_ptr,
         {**dec, "DIRECT_OUT": True}, 4, 2, False),
        ("decode merge", "kernels.decode_attention", "_decode_merge_kernel",
         {"mid_o": "fp32", "mid_lse": "fp32", "o": "bf16", "kv_start": "i32"},
         dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_S=32, HAS_PREFIX=False), 4, 1, False),
    ]


def main() -> int:
    failed = 0
    for name, module, kernel, ptrs, const, warps, stages, loads_first in variants():
        try:
            ok, detail = check_ptx(compile_ptx(module, kernel, ptrs, const, warps, stages), loads_first)
        except Exception as e:  # noqa: BLE001 - report every variant
            ok, detail = False, f"{type(e).__name__}: {str(e)[:400]}"
        failed += not ok
        print(f"{'ok   ' if ok else 'FAIL '} {name:32s} {detail}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
