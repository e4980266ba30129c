"""FP8 weights at M = 1 (the batch-1 decode step, issue 19): where the int GEMV's time goes, and
whether the tensor cores read the weights faster.

    python3 bench/lab/fp8_m1_lab.py [--budget-s 240] [--shapes gate_up,down] [--out F]   # H200
    python3 bench/lab/fp8_m1_lab.py --sass        # the int GEMV's sm_90 loop, no GPU needed
    ncu --clock-control none --metrics M1,M2,... -k regex:'_lab_|_fp8_int|_w8a8' \
        python3 bench/lab/fp8_m1_lab.py --ncu                                             # counters

The FP8 step's linears read 7.07 GB at 3.38 TB/s where bf16's read 14.1 GB at 4.11 (docs/benchmarks.md,
"The batch-1 decode step kernel by kernel"); FP8 / bf16 0.643 against the goal's 0.6. The int GEMV's
sm_90 loop issues ~18-19 instructions per 4-byte weight word (ptxas + nvdisasm: 8 x 128 gate_up 151
instructions for 8 words per thread; 44 SHF, 34 LOP3, 32 FFMA, 22 IMAD, 9 LDG; `--sass`), ~4.7 per
byte. Per shape (Qwen2.5-7B's qkv, o, gate_up, down and the LM head, M = 1),
each variant timed as one CUDA graph of back-to-back calls over rotating weight copies (>= 256 MB, so
L2 holds none of them), PDL off unless named:
  - int / int_pdl: kernels/gemv_fp8_int.py at FP8_INT_TUNED's config, PDL off / on;
  - lab0 / lab1 / lab2 at the same config: a copy of its loop (one row, no split) computing the real
    sums (lab0, checked), with the e4m3 -> fp32 conversion replaced by a bitcast (lab1: the
    conversion's cost; sums wrong, not checked), and with only the loads (lab2: the words xor-ed
    together; what the bytes alone take in this access pattern), lab2 also at the grid's best config;
  - w8a8_ptr: kernels/gemm_fp8.py's swapped form (16 token rows, x quantized per token; wgmma with
    e4m3 operands, pointer loads software-pipelined), over tiles / stages / K splits;
  - w8a8_tma: a lab kernel of the same math with the weight (and x) tiles loaded through host TMA
    descriptors, same grid; K splits add into an fp32 row (zeroed in the graph: counted);
  - quant: per_token_quant_fp8 at M = 1 (what W8A8 adds where no kernel before it quantizes).
W8A8 variants are checked against the fp32 product of the same quantized operands. Prints one table
(us, TB/s of the weight bytes) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
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

from bench.common import cuda_ms, graph_ms, rel_err, run_header  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
from radixrt.kernels import gemm_fp8 as GF  # noqa: E402
from radixrt.kernels import gemv_fp8_int as G8  # noqa: E402
from radixrt.kernels import pdl as PDL  # noqa: E402
from radixrt.kernels.fp8_quant import per_token_quant_fp8  # noqa: E402
from radixrt.kernels.gemv_fp8_int import _e4m3_word_to_f32, _fma_quad  # noqa: E402
from radixrt.models.quant.fp8 import quantize_per_channel  # noqa: E402

SHAPES = {"gate_up": (37888, 3584), "down": (3584, 18944), "qkv": (4608, 3584), "o": (3584, 3584),
          "lm_head": (152064, 3584)}
ROTATE = 256 << 20
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


@triton.jit
def _lab_int_kernel(x, w, w_scale, y, N, K4, stride_w4,
                    BLOCK_N: tl.constexpr, BLOCK_K4: tl.constexpr, EVEN_K: tl.constexpr, MODE: tl.constexpr):
    """The int GEMV's loop at one row. MODE 0: real sums; 1: the e4m3 words bitcast to fp32 instead
    of converted (wrong sums); 2: loads only (the words xor-ed; the xor stored so nothing is dropped)."""
    X_SCALE: tl.constexpr = 281474976710656.0
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K4)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    w_ptrs = w + rows[:, None] * stride_w4 + offs_k[None, :]
    xk = offs_k[None, :] + 0 * offs_n[:, None]
    acc = tl.zeros((BLOCK_N, BLOCK_K4), dtype=tl.float32)
    iacc = tl.zeros((BLOCK_N, BLOCK_K4), dtype=tl.int32)
    for k0 in range(0, K4, BLOCK_K4):
        kmask = ((k0 + xk) < K4) | EVEN_K
        wv = tl.load(w_ptrs + k0, mask=kmask, other=0)
        if MODE == 2:
            iacc = iacc ^ wv
        else:
            if MODE == 0:
                f0 = _e4m3_word_to_f32(wv, 0)
                f1 = _e4m3_word_to_f32(wv, 1)
                f2 = _e4m3_word_to_f32(wv, 2)
                f3 = _e4m3_word_to_f32(wv, 3)
            else:
                f0 = wv.to(tl.float32, bitcast=True)
                f1 = (wv ^ 1).to(tl.float32, bitcast=True)
                f2 = (wv ^ 2).to(tl.float32, bitcast=True)
                f3 = (wv ^ 3).to(tl.float32, bitcast=True)
            acc = _fma_quad(acc, x, 0, 0, k0 + xk, kmask, f0, f1, f2, f3, X_SCALE)
    nmask = offs_n < N
    if MODE == 2:
        v = tl.xor_sum(iacc, axis=1).to(tl.float32)
    else:
        v = tl.sum(acc, axis=1) * (tl.load(w_scale + rows) * 4722366482869645213696.0)
    tl.store(y + offs_n, v.to(y.dtype.element_ty), mask=nmask)


def lab_int(x, w, s, y, bn: int, bk4: int, mode: int) -> None:
    n, k = w.shape
    k4 = k // 4
    bk4 = min(bk4, triton.next_power_of_2(k4))
    _lab_int_kernel[(triton.cdiv(n, bn),)](x.view(torch.int64), w.view(torch.int32), s, y, n, k4, k4,
                                           BLOCK_N=bn, BLOCK_K4=bk4, EVEN_K=k4 % bk4 == 0, MODE=mode,
                                           num_warps=4, num_stages=1)


@triton.jit
def _w8a8_tma_kernel(x_desc, w_desc, x_scale, w_scale, y, y32, N, K, k_per_split,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
                     SPLIT: tl.constexpr, STAGES: tl.constexpr):
    """y[0, n] = x_scale * w_scale[n] * sum_k xq[0, k] w[n, k]: the weight tile [BLOCK_N, BLOCK_K] on
    wgmma's M side, x (padded to BLOCK_T rows, rows > 0 zero) on its N side, e4m3 operands both
    K-major as stored. SPLIT: each K split adds its scaled sums into y32 (fp32, zeroed before)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    k_start = pid_k * k_per_split
    k_stop = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
    for k0 in tl.range(k_start, k_stop, BLOCK_K, num_stages=STAGES):
        wt = w_desc.load([n0, k0])
        xt = x_desc.load([0, k0])
        acc = tl.dot(wt, xt.T, acc)
    cols = tl.arange(0, BLOCK_T)
    v = tl.sum(tl.where(cols[None, :] == 0, acc, 0.0), axis=1)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    v = v * tl.load(w_scale + offs_n, mask=nmask, other=0.0) * tl.load(x_scale)
    if SPLIT:
        tl.atomic_add(y32 + offs_n, v, mask=nmask, sem="relaxed")
    else:
        tl.store(y + offs_n, v.to(y.dtype.element_ty), mask=nmask)


class TmaOperands:
    """Host TMA descriptors of one weight and of x padded to BLOCK_T rows, for one tile shape."""

    def __init__(self, xq16: torch.Tensor, w: torch.Tensor, bn: int, bk: int):
        from triton.tools.tensor_descriptor import TensorDescriptor

        self.w_desc = TensorDescriptor.from_tensor(w, [bn, bk])
        self.x_desc = TensorDescriptor.from_tensor(xq16, [xq16.shape[0], bk])


def w8a8_tma(ops: TmaOperands, xs, ws, y, y32, n, k, bn, bk, split, stages) -> None:
    per = triton.cdiv(triton.cdiv(k, split), bk) * bk
    splits = triton.cdiv(k, per)
    if splits > 1:
        y32.zero_()
    _w8a8_tma_kernel[(triton.cdiv(n, bn), splits)](ops.x_desc, ops.w_desc, xs, ws, y, y32, n, k, per,
                                                   BLOCK_N=bn, BLOCK_K=bk, BLOCK_T=16, SPLIT=splits > 1,
                                                   STAGES=stages, num_warps=4, num_stages=stages)


def _alloc(size: int, align: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


class Shape:
    """Rotating FP8 weight copies of one [N, K] shape (>= ROTATE bytes together), x and outputs."""

    def __init__(self, n: int, k: int):
        self.n, self.k = n, k
        copies = max(2, math.ceil(ROTATE / (n * k)))
        w16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        base = quantize_per_channel(w16)
        del w16
        self.w8 = [base] + [(base[0].clone(), base[1].clone()) for _ in range(copies - 1)]
        self.x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        self.xq, self.xs = per_token_quant_fp8(self.x)
        self.xq16 = torch.zeros(16, k, device="cuda", dtype=self.xq.dtype)
        self.xq16[:1] = self.xq
        self.y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        self.y32 = torch.zeros(n, device="cuda", dtype=torch.float32)
        w, s = self.w8[-1]  # the outputs hold the last call's result: that of the last copy
        wf = w.float() * s[:, None]
        self.ref = self.x.float() @ wf.t()
        self.ref_a8 = (self.xq.float() * self.xs) @ wf.t()
        self.bytes = n * k

    def time(self, calls, check=None, out=None) -> dict:
        """One CUDA graph of `calls` (one per weight copy); us per call, TB/s, rel err when checked."""
        def run() -> None:
            for c in calls:
                c()
        try:
            out = self.y if out is None else out
            out.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            res: dict = {}
            if check is not None:
                err = rel_err(out.view(1, -1).float(), check)
                res["rel_err"] = err
                if not err <= 5e-2:
                    return {"error": f"rel err {err}"}
            us = graph_ms(run, timer=lambda f: cuda_ms(f, warmup=10, rep=50)) * 1e3 / len(calls)
            return {**res, "us": us, "tbs": self.bytes / us / 1e6}
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {str(e)[:240]}"}


LAB_GRID = [(4, 256), (4, 512), (8, 128), (8, 256), (8, 512), (16, 128), (16, 256), (32, 128)]
W8A8_GRID = [(64, 128, 4, None), (64, 128, 6, None), (128, 128, 4, None), (64, 256, 4, None),
             (128, 256, 3, None), (64, 128, 4, 1)]  # (block_n, block_k, stages, split: None = fill SMs)


def auto_split(n: int, k: int, bn: int, bk: int, num_sms: int) -> int:
    tiles = triton.cdiv(n, bn)
    return max(1, min(triton.cdiv(2 * num_sms, tiles), k // (2 * bk)))


def bench_shape(name: str, n: int, k: int, deadline: float, num_sms: int) -> dict:
    sh = Shape(n, k)
    row: dict = {"n": n, "k": k, "mb": sh.bytes / 1e6}
    cfg = G8.fp8_int_config(1, n, k)
    tuned = (cfg.block_n, cfg.block_k4)
    row["tuned"] = f"{tuned[0]}x{tuned[1]}"
    for label, pdl in (("int", False), ("int_pdl", True)):
        PDL.enabled = pdl
        calls = [partial(G8.fp8_int_gemv, sh.x, w, s, None, sh.y, *tuned, 1, 4) for w, s in sh.w8]
        row[label] = sh.time(calls, sh.ref)
    PDL.enabled = False
    for mode in (0, 1, 2):
        row[f"lab{mode}"] = sh.time([partial(lab_int, sh.x, w, s, sh.y, *tuned, mode) for w, s in sh.w8],
                                    sh.ref if mode == 0 else None)
    row["quant"] = sh.time([partial(per_token_quant_fp8, sh.x)], None, out=torch.zeros(1))
    for kind in ("ptr", "tma"):
        best = None
        for bn, bk, stages, split in W8A8_GRID:
            if time.time() > deadline:
                break
            split = auto_split(n, k, bn, bk, num_sms) if split is None else split
            label = f"{bn}x{bk}s{stages}k{split}"
            if kind == "ptr":
                gc = GF.Fp8GemmConfig(16, bn, bk, num_warps=4, num_stages=stages, swap_ab=True, split_k=split,
                                      group_m=1)
                need = gc.workspace_need(1, n, k)
                ws = G8.SkinnyWorkspace.allocate(max(1, need[0]), max(1, need[1]), sh.x.device)
                calls = [partial(GF.fp8_gemm, sh.xq, sh.xs, w, s, out=sh.y, config=gc, workspace=ws)
                         for w, s in sh.w8]
                r = sh.time(calls, sh.ref_a8)
            else:
                try:
                    ops = [TmaOperands(sh.xq16, w, bn, bk) for w, _ in sh.w8]
                except Exception as e:  # noqa: BLE001
                    r = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                else:
                    out = sh.y32 if split > 1 else sh.y
                    calls = [partial(w8a8_tma, o, sh.xs, s, sh.y, sh.y32, n, k, bn, bk, split, stages)
                             for o, (_, s) in zip(ops, sh.w8, strict=True)]
                    r = sh.time(calls, sh.ref_a8, out=out)
            row[f"w8a8_{kind}:{label}"] = r
            log(f"  {name} w8a8_{kind} {label}: {r}")
            if "us" in r and (best is None or r["us"] < best[1]["us"]):
                best = (label, r)
        if best:
            row[f"w8a8_{kind}_best"] = {**best[1], "cfg": best[0]}
    best2 = None
    for bn, bk4 in LAB_GRID:
        if time.time() > deadline:
            break
        r = sh.time([partial(lab_int, sh.x, w, s, sh.y, bn, bk4, 2) for w, s in sh.w8])
        if "us" in r and (best2 is None or r["us"] < best2[1]["us"]):
            best2 = (f"{bn}x{bk4}", r)
    if best2:
        row["lab2_best"] = {**best2[1], "cfg": best2[0]}
    return row


def print_table(rows: dict) -> None:
    cols = ["int", "int_pdl", "lab0", "lab1", "lab2", "lab2_best", "w8a8_ptr_best", "w8a8_tma_best", "quant"]
    print("\n| shape | MB | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for name, r in rows.items():
        cells = []
        for c in cols:
            v = r.get(c, {})
            if "us" in v:
                cell = f"{v['us']:.2f}" + (f" ({v['tbs']:.2f})" if c != "quant" else "")
                if "cfg" in v:
                    cell += f" {v['cfg']}"
            else:
                cell = "err" if v else ""
            cells.append(cell)
        print(f"| {name} | {r['mb']:.1f} | " + " | ".join(cells) + " |")
    print("(us per call; in brackets the weight's TB/s; lab1 / lab2 compute wrong sums on purpose)")


# (block_n, block_k4, split_k, prefetch) of the int GEMV; split-K through its serial fix-up (gemv's
# _sum_splits); prefetch: the next chunk's words loaded before this chunk is computed (two in flight).
# H200 2026-12-03 (PDL on): every split lost to the tuned split-free configs (down 25.3-30.6 against
# 23.0 us at 4 x 512), so the default grid is now the prefetch forms beside the tuned ones.
INT_GRID = [(4, 512, 1, False), (4, 512, 1, True), (2, 512, 1, True), (4, 256, 1, True), (8, 256, 1, True),
            (4, 1024, 1, True), (8, 512, 1, False), (8, 512, 1, True), (8, 128, 1, False), (8, 128, 1, True),
            (16, 128, 1, True), (4, 512, 2, False), (8, 256, 4, False)]


def int_grid(name: str, n: int, k: int, pdl: bool, deadline: float) -> dict:
    """The int GEMV over INT_GRID at M = 1 (PDL as given): us per call in a graph of back-to-back
    calls over the rotating weight copies, each checked first."""
    PDL.enabled = pdl
    sh = Shape(n, k)
    row: dict = {"n": n, "k": k, "pdl": pdl}
    for bn, bk4, split, prefetch in INT_GRID:
        if time.time() > deadline or bk4 > triton.next_power_of_2(k // 4):
            continue
        cfg = G8.Fp8IntConfig(bn, bk4, split_k=split, prefetch=prefetch)
        need_p, need_c = G8.int_workspace_need(cfg, 1, n, k)
        ws = G8.SkinnyWorkspace.allocate(max(1, need_p), max(1, need_c), sh.x.device)
        calls = [partial(G8.fp8_skinny_linear, sh.x, w, s, out=sh.y, workspace=ws, config=cfg)
                 for w, s in sh.w8]
        row[f"{bn}x{bk4}k{split}" + ("p" if prefetch else "")] = r = sh.time(calls, sh.ref)
        log(f"  {name} int {bn}x{bk4} split {split} prefetch {prefetch} pdl {pdl}: {r}")
    PDL.enabled = False
    return row


def sass_report(names: list[str]) -> None:
    """The int GEMV's sm_90 main loop at each shape's tuned M = 1 config, compiled on this machine (no
    GPU: Triton's bundled ptxas and nvdisasm, as bench/kernels/compile_sm90.py uses them): SASS
    instructions in the loop, per 4-byte weight word each thread handles, and the opcode counts."""
    import re
    import subprocess
    import tempfile

    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    sys.path.insert(0, str(ROOT / "bench" / "kernels"))
    import compile_sm90 as C

    fn = G8._fp8_int_gemv_kernel
    sig = dict(x="*i64", w="*i32", w_scale="*fp32", bias="*bf16", y="*bf16", partials="*fp32",
               counters="*i32")
    for name in names:
        cfg = G8.fp8_int_config(1, *SHAPES[name])
        const = dict(ROWS=1, BLOCK_M=1, BLOCK_N=cfg.block_n, BLOCK_K4=cfg.block_k4, EVEN_K=True, SPLIT=False,
                     HAS_BIAS=False, PREFETCH=False, USE_PDL=True)
        types = {n: "constexpr" if n in const else sig.get(n, "i32") for n in fn.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                 if n not in const and (types[n].startswith("*") or n.startswith("stride"))}
        src = ASTSource(fn=fn, signature=types, attrs=attrs,
                        constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
        ptx = triton_compile(src, target=C.TARGET, options={"num_warps": 4, "num_stages": 1}).asm["ptx"]
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "k.ptx").write_text(ptx)
            subprocess.run([str(C._nvidia_tool("ptxas")), "-arch=sm_90a", str(Path(tmp) / "k.ptx"), "-o",
                            str(Path(tmp) / "k.cubin")], check=True, capture_output=True)
            lines = subprocess.run([str(C._nvidia_tool("nvdisasm")), "-c", str(Path(tmp) / "k.cubin")],
                                   capture_output=True, text=True, check=True).stdout.splitlines()
        labels = {m.group(1): i for i, ln in enumerate(lines)
                  for m in [re.match(r"\s*\.L_x_(\d+):", ln)] if m}
        loops = [(labels[m.group(1)], i) for i, ln in enumerate(lines)
                 for m in [re.search(r"BRA[^`]*`\(\.L_x_(\d+)\)", ln)] if m and labels.get(m.group(1), i) < i]
        a, b = max(loops, key=lambda ab: ab[1] - ab[0])
        ops: dict[str, int] = {}
        for ln in lines[a:b + 1]:
            m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]+)", ln)
            if m:
                ops[m.group(1)] = ops.get(m.group(1), 0) + 1
        total = sum(ops.values())
        words = cfg.block_n * cfg.block_k4 / 128  # per thread and loop step (4 warps)
        top = ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
        print(f"{name} {cfg.block_n} x {cfg.block_k4}: {total} instructions per loop step, {words:.0f} words "
              f"per thread: {total / words:.1f} per word ({top})")


def ncu_mode(names: list[str]) -> None:
    """Each variant twice, eagerly, PDL off, for ncu (the second call of each is the one to read)."""
    PDL.enabled = False
    for name in names:
        n, k = SHAPES[name]
        sh = Shape(n, k)
        w, s = sh.w8[0]
        cfg = G8.fp8_int_config(1, n, k)
        for _ in range(2):
            G8.fp8_int_gemv(sh.x, w, s, None, sh.y, cfg.block_n, cfg.block_k4, 1, 4)
        for _ in range(2):
            lab_int(sh.x, w, s, sh.y, cfg.block_n, cfg.block_k4, 2)
        ops = TmaOperands(sh.xq16, w, 64, 128)
        for _ in range(2):
            w8a8_tma(ops, sh.xs, s, sh.y, sh.y32, n, k, 64, 128, auto_split(n, k, 64, 128, 132), 4)
        torch.cuda.synchronize()
        print(f"ncu: {name} done", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--sass", action="store_true", help="the int GEMV's sm_90 loop, compiled on the CPU")
    ap.add_argument("--int-grid", action="store_true", help="only the int GEMV's split-K grid, PDL on")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "fp8_m1_lab.json"))
    args = ap.parse_args()
    triton.set_allocator(_alloc)
    names = [s for s in args.shapes.split(",") if s]
    if args.sass:
        sass_report(names)
        return 0
    if args.ncu:
        ncu_mode(names)
        return 0
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    report: dict = {"header": run_header(), "shapes": {}}
    end = time.time() + args.budget_s
    if args.int_grid:
        for i, name in enumerate(names):
            share = (end - time.time()) / (len(names) - i)
            report["shapes"][name] = row = int_grid(name, *SHAPES[name], True, time.time() + share)
            Path(args.out).write_text(json.dumps(report, indent=1, default=str))
            ok = {c: v for c, v in row.items() if isinstance(v, dict) and "us" in v}
            ranked = sorted(ok.items(), key=lambda kv: kv[1]["us"])
            print(f"{name}: " + ", ".join(f"{c} {v['us']:.2f}" for c, v in ranked))
            torch.cuda.empty_cache()
        return 0
    for i, name in enumerate(names):
        n, k = SHAPES[name]
        log(f"{name} {n} x {k}")
        share = (end - time.time()) / (len(names) - i)
        report["shapes"][name] = bench_shape(name, n, k, time.time() + share, num_sms)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        torch.cuda.empty_cache()
    print_table(report["shapes"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
