"""Compile the attention kernels for an H100/H200 (sm_90) on a machine without a GPU.

Triton's PyPI wheel carries ptxas, so `triton.compile` with an explicit GPUTarget lowers a kernel to
PTX and a cubin without a driver. This catches Triton code that runs in the interpreter (CPU tests)
but does not compile, and reports each variant's shared memory, before a GPU is booked.

Arguments are specialised as the launcher specialises them at run time: pointers and the strides
that are multiples of 16 elements carry `tt.divisibility = 16` (without it, loads are not vectorised
and nothing is pipelined, which would make the check below meaningless). For each variant the
`num` of every `ttg.async_wait` in the TTGIR is reported: a wait for fewer than all outstanding
copies (num > 0) inside a loop means K/V blocks stay in flight while a block is computed. Variants
marked `pipelined` must show one per paged loop (the page ids are loaded a step ahead for this:
kernels/paged_loop.py, prefetch_pages); the script fails if they do not, or if a variant's loops
load or store spilled registers (ptxas_usage: registers per thread, spill bytes and local-memory
instructions from ptxas -v and nvdisasm, the tools Triton's wheel carries).

    python3 bench/kernels/compile_sm90.py          # exit status 1 if any variant fails
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET=1 (the interpreter does not compile)")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler import compile as triton_compile  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
POINTERS_BF16 = {"q", "k_new", "v_new", "k_desc", "v_desc", "k_buf", "v_buf", "o"}
POINTERS_I32 = {"page_table", "prefix_lens", "extend_lens", "extend_start_loc", "seq_lens", "kv_start",
                "group_members", "group_starts", "group_prefix_lens"}
POINTERS_F32 = {"mid_o", "mid_lse"}
FLOATS = {"qk_scale"}


# strides whose run-time values are not multiples of 16 (page-table rows have any width; the split
# workspace strides are not specialised: decode_attention's do_not_specialize)
NOT_DIVISIBLE = {"stride_pt_b", "stride_mo_b", "stride_mo_h", "stride_mo_s", "stride_ml_b", "stride_ml_h"}


def compile_variant(module: str, kernel: str, const: dict, num_warps: int, num_stages: int,
                    pool: str = "bf16") -> dict:
    fn = getattr(importlib.import_module(module), kernel)
    # constexpr parameters left out take their defaults, as at a launch that does not pass them
    defaults = {p.name: p.default for p in fn.params
                if p.is_constexpr and p.default is not inspect.Parameter.empty}
    const = {**defaults, **const}
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        sig[n] = ("constexpr" if n in const else f"*{pool}" if n in ("k_buf", "v_buf")
                  else "*bf16" if n in POINTERS_BF16
                  else "*i32" if n in POINTERS_I32 else "*fp32" if n in POINTERS_F32
                  else "fp32" if n in FLOATS else "i32")
        if n in ("k_desc", "v_desc") and const.get("USE_TMA"):  # host TMA descriptors of the new K/V
            sig[n] = f"tensordesc<bf16[{const['BLOCK_N']}, {const['BLOCK_D']}]>"
        divisible = sig[n].startswith("*") or (n.startswith("stride") and n not in NOT_DIVISIBLE)
        if n not in const and divisible:
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
                    attrs=attrs)
    t0 = time.perf_counter()
    k = triton_compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})
    waits = [int(w) for w in re.findall(r"ttg\.async_wait .*?\{num = (\d+) : i32\}", k.asm["ttgir"])]
    return {"seconds": time.perf_counter() - t0, "shared_bytes": k.metadata.shared, "async_waits": waits,
            "ptx": k.asm["ptx"]}


def _nvidia_tool(name: str) -> Path:
    import triton

    if name == "ptxas" and os.environ.get("TRITON_PTXAS_PATH"):
        return Path(os.environ["TRITON_PTXAS_PATH"])
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def ptxas_usage(ptx: str) -> dict:
    """Registers and spills of `ptx` for sm_90a, with Triton's bundled ptxas (or TRITON_PTXAS_PATH)
    and nvdisasm: {"regs": per thread, "spill_bytes": ptxas -v's spill stores, "local_ops": STL / LDL
    instructions in the SASS, "local_ops_in_loops": those between a backward branch and its target},
    or {} when a tool is missing. Registers bound the programs per SM (65,536 per SM; the H200's ncu
    profile of the FP8 decode kernel, 2026-12-03, showed the 191 registers this reports for it);
    spills outside the loops cost once per program, inside them once per block."""
    import subprocess
    import tempfile

    ptxas, nvdisasm = _nvidia_tool("ptxas"), _nvidia_tool("nvdisasm")
    if not ptxas.is_file() or not nvdisasm.is_file():
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        err = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(src), "-o", str(cubin)],
                             capture_output=True, text=True).stderr
        sass = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True).stdout
    regs = re.search(r"Used (\d+) registers", err)
    spill = re.search(r"(\d+) bytes spill stores", err)
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines)
              for m in [re.match(r"\.L_x_(\d+):", line.strip())] if m}
    loops = [(labels[m.group(1)], i) for i, line in enumerate(lines)
             for m in [re.search(r"BRA[^`]*`\(\.L_x_(\d+)\)", line)] if m and labels.get(m.group(1), i) < i]
    local = [i for i, line in enumerate(lines) if re.search(r"\b(STL|LDL)(\.\w+)*\b", line)]
    in_loops = sum(any(a <= i <= b for a, b in loops) for i in local)
    return {"regs": int(regs.group(1)) if regs else None, "spill_bytes": int(spill.group(1)) if spill else 0,
            "local_ops": len(local), "local_ops_in_loops": in_loops}


def check_fp8_mma() -> bool:
    """The FP8-operand decode forms (kernels/paged_loop_fp8.py) over an e4m3 pool: "fp8x2" must run
    both dots as e4m3 wgmma (QGMMA) with no e4m3 -> fp16 conversion left (the "f16" form has one per
    two K/V values), "qk8" its score dot as e4m3 wgmma and half the f16 form's conversions (V only).
    Prints one ok / FAIL line."""
    dec = dict(GROUP=7, PAGE_SIZE=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_H=16, BLOCK_N=128,
               DOT_PRECISION="tf32", HAS_KV_START=False, DIRECT_OUT=False, MERGE_PREFIX=False, PREFIX_SLOTS=0)
    forms = {}
    for kv_dot in ("f16", "fp8x2", "qk8"):
        ptx = compile_variant("kernels.decode_attention", "_decode_split_kernel", {**dec, "KV_DOT": kv_dot},
                              4, 3, pool="fp8e4nv")["ptx"]
        forms[kv_dot] = (len(re.findall(r"wgmma\.mma_async\S*\.e4m3\.e4m3", ptx)),
                         ptx.count("cvt.rn.f16x2.e4m3x2"))
    ok = (forms["fp8x2"][0] > 0 and forms["fp8x2"][1] == 0 and forms["f16"][1] > 0
          and forms["qk8"][0] > 0 and 2 * forms["qk8"][1] == forms["f16"][1])
    print(f"{'ok   ' if ok else 'FAIL '} decode FP8 MMA operands         (e4m3 wgmma, e4m3->f16 cvt): "
          + ", ".join(f"{k} {v}" for k, v in forms.items()), flush=True)
    return ok


def check_fp8_v_widen() -> bool:
    """kv_dot "f16v" (kernels/paged_loop.py V_WIDEN) over an e4m3 pool reads V from shared memory in
    vectors and transposes it as fp16 (`ldmatrix ... .trans`), where "f16" reads it one byte per load
    (`ld.shared.b8`); "f16v8" does the same from 8-byte V loads (`cp.async` of 8 bytes, more copies
    than "f16v"). Prints one ok / FAIL line with the byte-load, ldmatrix.trans and cp.async counts."""
    dec = dict(GROUP=7, PAGE_SIZE=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_H=16, BLOCK_N=128,
               DOT_PRECISION="tf32", HAS_KV_START=False, DIRECT_OUT=True, MERGE_PREFIX=False, PREFIX_SLOTS=0)
    forms = {}
    for kv_dot in ("f16", "f16v", "f16v8"):
        ptx = compile_variant("kernels.decode_attention", "_decode_split_kernel", {**dec, "KV_DOT": kv_dot},
                              4, 3, pool="fp8e4nv")["ptx"]
        forms[kv_dot] = (ptx.count("ld.shared.b8"), len(re.findall(r"ldmatrix\S*\.trans", ptx)),
                         ptx.count("cp.async.cg") + ptx.count("cp.async.ca"))
    ok = (all(forms[f][0] == 0 and forms[f][1] > 0 for f in ("f16v", "f16v8"))
          and forms["f16v8"][2] > forms["f16v"][2])
    print(f"{'ok   ' if ok else 'FAIL '} decode FP8 V widened before its dot (ld.shared.b8, ldmatrix.trans, "
          "cp.async): "
          + ", ".join(f"{k} {v}" for k, v in forms.items()), flush=True)
    return ok


def variants() -> list[tuple[str, str, str, dict, int, int, int]]:
    """(name, module, kernel, constexprs, num_warps, num_stages, pipelined loops) at the GPU configs
    of Qwen2.5-7B shapes (GQA 7, head dim 128, page 16). `pipelined loops`: how many waits with
    num > 0 the TTGIR must hold (one per loop that keeps K/V blocks in flight; 2-stage variants
    overlap nothing, so 0 is expected of them)."""
    ext = dict(GROUP=7, PAGE_SIZE=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=128, BLOCK_N=64,
               DOT_PRECISION="tf32", USE_TMA=False)
    dec = dict(GROUP=7, PAGE_SIZE=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_H=16, BLOCK_N=128,
               DOT_PRECISION="tf32", KV_DOT="q")
    casc = dict(GROUP=7, PAGE_SIZE=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=128, BLOCK_N=64,
                DOT_PRECISION="tf32")
    merge = dict(HEAD_DIM=128, BLOCK_D=128)
    ext64 = {**ext, "BLOCK_M": 64}
    plain = {"HAS_KV_START": False, "DIRECT_OUT": False, "MERGE_PREFIX": False, "PREFIX_SLOTS": 0}
    return [
        # three loops: the paged prefix, new tokens before the block, the diagonal
        ("extend, GQA packing", "kernels.extend_attention", "_extend_attn_kernel", {**ext, "PACK_GQA": True},
         8, 3, 3),
        # the new tokens' K/V through TMA (barrier waits, not async_wait): the paged loop's remain
        ("extend, TMA new K/V", "kernels.extend_attention", "_extend_attn_kernel",
         {**ext, "PACK_GQA": True, "USE_TMA": True}, 8, 3, 1),
        ("extend 64-row, GQA packing", "kernels.extend_attention", "_extend_attn_kernel",
         {**ext64, "PACK_GQA": True}, 4, 2, 0),
        ("extend, MHA", "kernels.extend_attention", "_extend_attn_kernel",
         {**ext, "GROUP": 1, "PACK_GQA": False}, 8, 3, 3),
        ("decode split -> mid", "kernels.decode_attention", "_decode_split_kernel", {**dec, **plain}, 4, 2,
         0),
        ("decode split, 3 stages", "kernels.decode_attention", "_decode_split_kernel",
         {**dec, **plain, "BLOCK_N": 64}, 4, 3, 1),
        ("decode one split -> out", "kernels.decode_attention", "_decode_split_kernel",
         {**dec, **plain, "DIRECT_OUT": True}, 4, 2, 0),
        # PEEL_TAIL (not the default): whole blocks unmasked in the loop, the last one after it
        ("decode split, 3 stages, peeled tail", "kernels.decode_attention", "_decode_split_kernel",
         {**dec, **plain, "BLOCK_N": 64, "PEEL_TAIL": 2}, 4, 3, 1),
        # keys split across the warps (paged_attn_loop_ws; an FP8 pool's "long" config, here on bf16):
        # the whole-block loop keeps K/V blocks in flight
        ("decode split, warp split, 3 stages", "kernels.decode_attention", "_decode_split_kernel",
         {**dec, **plain, "BLOCK_N": 64, "WARP_SPLIT": 2}, 2, 3, 1),
        ("cascade suffix -> mid", "kernels.decode_attention", "_decode_split_kernel",
         {**dec, **plain, "HAS_KV_START": True}, 4, 2, 0),
        ("cascade suffix + merge -> out", "kernels.decode_attention", "_decode_split_kernel",
         {**dec, "BLOCK_N": 64, "HAS_KV_START": True, "DIRECT_OUT": True, "MERGE_PREFIX": True,
          "PREFIX_SLOTS": 4},
         4, 2, 0),
        ("decode merge", "kernels.decode_attention", "_decode_merge_kernel",
         {**merge, "BLOCK_S": 32, "HAS_PREFIX": True}, 4, 1, 0),
        ("cascade prefix 128-row", "kernels.cascade_attention", "_cascade_prefix_kernel", casc, 8, 3, 1),
        ("cascade prefix 64-row", "kernels.cascade_attention", "_cascade_prefix_kernel",
         {**casc, "BLOCK_M": 64, "BLOCK_N": 32}, 4, 2, 0),
        # the rows' requests / heads recomputed after the loop (config "cascade" remat_rows, off):
        # no spills at all, where the default tile spills 448 B before its loop
        ("cascade prefix 128-row, rows recomputed", "kernels.cascade_attention", "_cascade_prefix_kernel",
         {**casc, "REMAT_ROWS": True}, 8, 3, 1),
    ]


def main() -> int:
    failed = 0
    for name, module, kernel, const, warps, stages, want_pipelined in variants():
        try:
            r = compile_variant(module, kernel, const, warps, stages)
        except Exception as e:  # noqa: BLE001 - report every variant
            failed += 1
            print(f"FAIL  {name:32s} {type(e).__name__}: {str(e)[:400]}", flush=True)
            continue
        pipelined = sum(w > 0 for w in r["async_waits"])
        use = ptxas_usage(r["ptx"])
        status = "ok   " if pipelined >= want_pipelined else "SLOW "
        if use.get("local_ops_in_loops"):  # spilled registers reloaded in every block of a loop
            status = "SPILL"
        failed += status != "ok   "
        print(f"{status} {name:32s} {r['seconds']:5.1f} s  shared {r['shared_bytes'] / 1024:6.1f} KiB  "
              f"{warps} warps {stages} stages  regs {use.get('regs')} spills {use.get('spill_bytes')} B "
              f"({use.get('local_ops')} local ops, {use.get('local_ops_in_loops')} in loops)  "
              f"async waits {r['async_waits']} (pipelined loops {pipelined}, want >= {want_pipelined})",
              flush=True)
    failed += not check_fp8_mma()
    failed += not check_fp8_v_widen()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
