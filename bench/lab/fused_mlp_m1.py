"""The batch-1 SwiGLU MLP with FP8 weights as one persistent kernel, against the three launches it
would replace (int GEMV gate_up, SiLU-and-mul, int GEMV down); issue 19's FP8 batch-1 step (0.64x
bf16 against the 0.6 goal). A lab kernel, not used by the engine: on the H200 it lost (docs/
benchmarks.md, "Batch-1 FP8 MLP in one kernel").

    python3 bench/lab/fused_mlp_m1.py [--budget-s 200] [--out F]      # H200, ~20 s

The kernel (`_mlp_fp8_m1_kernel`, `MlpFp8M1`): y [1, H] = (silu(x Wg^T) * (x Wu^T)) Wd^T, x [1, H] bf16,
Wgu [2I, H] and Wd [H, I] e4m3 with per-channel fp32 scales, the arithmetic per weight word that of
kernels/gemv_fp8_int.py (e4m3 bytes moved into fp32 bit fields, x scaled by 2^48, the scales by 2^72).
  - Phase 1: program p takes row tiles p, p + P, ... of BLOCK_N1 intermediate channels, reading
    their gate rows j and up rows I + j together, and stores act[j] = silu(g) * u (bf16; g and u in
    fp32, where the unfused path rounds them to bf16 first).
  - A grid-wide barrier (`_grid_barrier`: arrivals and a generation word, the last arrival resets the
    count and advances the generation; the others poll it, at most SPIN_LIMIT times, then set an
    error word that `check_barrier` raises on): every program must be resident at once, so the grid
    is sized from the compiled kernel's registers and shared memory (`max_programs_per_sm`).
    Programs that reach it early may first prefetch the first lines of their down rows into L2.
  - Phase 2: stream-K over (row block, K chunk) iterations of down against act: program p takes
    [p T / P, (p + 1) T / P); a share that is not a whole row block adds its fp32 sums into a
    scratch row, and whichever share completes the block (a per-block counter) writes y and clears
    the scratch and the counter, so every launch leaves its scratch zero (CUDA-graph safe).
  - phase_programs (P1, P2) runs the phases as two launches with no barrier (what the CPU
    interpreter runs: its programs execute one after another); P2 = 0 stops after phase 1 and
    returns act, the "gate_up with SiLU in its epilogue" form.
The bench: Qwen2.5-7B's MLP (H 3584, I 18944; 135.8 + 67.9 MB of e4m3 weights per layer), each variant
one CUDA graph over COPIES weight copies (>= 600 MB: L2 holds none between uses), each copy's MLP
after the RMSNorm that makes its input, PDL as in the engine; us per MLP (norm included). Rows: the
unfused FP8 path at FP8_INT_TUNED's configs, the bf16 path (skinny GEMVs + SiLU) for scale, the two-
launch forms, and the persistent kernel over a grid of its configs. Every variant is checked first
(relative error against the unfused FP8 path; the persistent kernel also for a barrier time-out
over 50 repeated launches and for equal output on a repeat).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import graph_ms, out_path, rel_err, run_header, write_json  # noqa: E402
from bench.kernels_import import import_kernels  # noqa: E402

import_kernels()
from radixrt.kernels._checks import FP8_DTYPE, check  # noqa: E402
from radixrt.kernels.activation import silu_and_mul  # noqa: E402
from radixrt.kernels.gemv import skinny_linear  # noqa: E402
from radixrt.kernels.gemv_fp8_int import _e4m3_word_to_f32, _x_quad, fp8_skinny_linear  # noqa: E402
from radixrt.kernels.norm import rms_norm  # noqa: E402
from radixrt.kernels.pdl import gdc_enter, launch_options, use_pdl  # noqa: E402
from radixrt.models.quant.fp8 import quantize_per_channel  # noqa: E402

SPIN_LIMIT = 1 << 22  # barrier polls before giving up (each an L2 atomic, ~1 us: ~4 s)
_SPIN_LIMIT = tl.constexpr(SPIN_LIMIT)


@triton.jit
def _prefetch_l2(ptrs):
    """prefetch.global.L2::evict_last of each address in ptrs (no value kept; never removed as dead)."""
    return tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _grid_barrier(bar, nprog):
    """Wait until all nprog programs have arrived. bar: int32 [3] = (arrivals, generation, error).
    The last to arrive resets arrivals and advances the generation (release); the others poll the
    generation (acquire), at most SPIN_LIMIT times, then set the error word and go on."""
    tl.debug_barrier()  # this program's stores precede its release
    gen = tl.atomic_add(bar + 1, 0, sem="acquire")
    arrived = tl.atomic_add(bar, 1, sem="acq_rel")
    if arrived == nprog - 1:
        tl.atomic_xchg(bar, 0, sem="relaxed")
        tl.atomic_add(bar + 1, 1, sem="release")
    else:
        cur = gen
        polls = 0
        while (cur == gen) & (polls < _SPIN_LIMIT):
            cur = tl.atomic_add(bar + 1, 0, sem="acquire")
            polls += 1
        if cur == gen:
            tl.atomic_xchg(bar + 2, 1, sem="relaxed")
    tl.debug_barrier()


@triton.jit
def _fma_words(acc, wv, x0, x1, x2, x3):
    return (acc + x0 * _e4m3_word_to_f32(wv, 0) + x1 * _e4m3_word_to_f32(wv, 1)
            + x2 * _e4m3_word_to_f32(wv, 2) + x3 * _e4m3_word_to_f32(wv, 3))


@triton.jit
def _mlp_fp8_m1_kernel(
    x64, w_gu, s_gu, w_dn, s_dn, act, act64, y, y32, done2, bar,
    INTER, H, K1_4, K2_4, stride_gu4, stride_dn4,
    BLOCK_N1: tl.constexpr, BLOCK_K1: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_K2: tl.constexpr,
    EVEN_K1: tl.constexpr, EVEN_K2: tl.constexpr, PHASE: tl.constexpr, PREFETCH_K2: tl.constexpr,
    PIPE: tl.constexpr = False, EARLY_LINES: tl.constexpr = 0, USE_PDL: tl.constexpr = False,
):
    """x64: x [1, H] bf16 as int64 words; w_gu [2I, H] / w_dn [H, INTER] e4m3 as int32 words; s_gu [2I],
    s_dn [H] fp32; act [INTER] bf16 (act64 the same memory as int64 words); y [1, H] bf16. PHASE 0: both
    phases and the barrier; 1 / 2: one phase. PREFETCH_K2: words of each down row of the program's
    first phase-2 tile prefetched into L2 before the barrier (0: none)."""
    X_SCALE: tl.constexpr = 281474976710656.0  # 2^48
    UNDO: tl.constexpr = 4722366482869645213696.0  # 2^72
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if EARLY_LINES > 0:  # before the wait (weights only): the first lines of this program's first rows
        el = tl.arange(0, EARLY_LINES) * 32
        if PHASE != 2:
            er = tl.minimum(pid * BLOCK_N1 + tl.arange(0, BLOCK_N1), INTER - 1).to(tl.int64)
            ep = w_gu + er[:, None] * stride_gu4 + tl.minimum(el, K1_4 - 1)[None, :]
            _prefetch_l2(ep)
            _prefetch_l2(ep + INTER.to(tl.int64) * stride_gu4)
        else:
            kit0 = tl.cdiv(K2_4, BLOCK_K2)
            it0 = (pid * (tl.cdiv(H, BLOCK_N2) * kit0)) // nprog
            er = tl.minimum((it0 // kit0) * BLOCK_N2 + tl.arange(0, BLOCK_N2), H - 1).to(tl.int64)
            ek = tl.minimum((it0 % kit0) * BLOCK_K2 + el, K2_4 - 1)
            _prefetch_l2(w_dn + er[:, None] * stride_dn4 + ek[None, :])
    gdc_enter(USE_PDL)  # kernels/pdl.py: x comes from the kernel before
    if PHASE != 2:
        offs_r = tl.arange(0, BLOCK_N1)
        offs_k = tl.arange(0, BLOCK_K1)
        xk = offs_k[None, :] + 0 * offs_r[:, None]  # x in the weight tile's shape (no shuffles)
        up_off = INTER.to(tl.int64) * stride_gu4
        for t in range(pid, tl.cdiv(INTER, BLOCK_N1), nprog):
            rows = t * BLOCK_N1 + offs_r
            rows_c = tl.minimum(rows, INTER - 1).to(tl.int64)
            g_ptrs = w_gu + rows_c[:, None] * stride_gu4 + offs_k[None, :]
            accg = tl.zeros((BLOCK_N1, BLOCK_K1), dtype=tl.float32)
            accu = tl.zeros((BLOCK_N1, BLOCK_K1), dtype=tl.float32)
            if PIPE:
                wgn = tl.load(g_ptrs, mask=(xk < K1_4) | EVEN_K1, other=0)
                wun = tl.load(g_ptrs + up_off, mask=(xk < K1_4) | EVEN_K1, other=0)
            for k0 in range(0, K1_4, BLOCK_K1):
                kmask = ((k0 + xk) < K1_4) | EVEN_K1
                if PIPE:
                    wg = wgn
                    wu = wun
                    nmask = (k0 + BLOCK_K1 + xk) < K1_4
                    wgn = tl.load(g_ptrs + k0 + BLOCK_K1, mask=nmask, other=0)
                    wun = tl.load(g_ptrs + up_off + k0 + BLOCK_K1, mask=nmask, other=0)
                else:
                    wg = tl.load(g_ptrs + k0, mask=kmask, other=0)
                    wu = tl.load(g_ptrs + up_off + k0, mask=kmask, other=0)
                x0, x1, x2, x3 = _x_quad(x64, 0, 0, k0 + xk, kmask, X_SCALE)
                accg = _fma_words(accg, wg, x0, x1, x2, x3)
                accu = _fma_words(accu, wu, x0, x1, x2, x3)
            g = tl.sum(accg, axis=1) * (tl.load(s_gu + rows_c) * UNDO)
            u = tl.sum(accu, axis=1) * (tl.load(s_gu + INTER + rows_c) * UNDO)
            a = g / (1.0 + tl.exp(-g)) * u
            tl.store(act + rows, a.to(act.dtype.element_ty), mask=rows < INTER)
    if PHASE == 0:
        if PREFETCH_K2 > 0:  # from where its phase-2 share starts; one address per 128-byte line
            kit2 = tl.cdiv(K2_4, BLOCK_K2)
            it0 = (pid * (tl.cdiv(H, BLOCK_N2) * kit2)) // nprog
            pr = tl.minimum((it0 // kit2) * BLOCK_N2 + tl.arange(0, BLOCK_N2), H - 1).to(tl.int64)
            pk = tl.minimum((it0 % kit2) * BLOCK_K2 + tl.arange(0, PREFETCH_K2 // 32) * 32, K2_4 - 1)
            _prefetch_l2(w_dn + pr[:, None] * stride_dn4 + pk[None, :])
        _grid_barrier(bar, nprog)
    if PHASE != 1:
        # stream-K over (row block, K chunk) iterations: program p takes [p T / P, (p + 1) T / P)
        offs_r2 = tl.arange(0, BLOCK_N2)
        offs_k2 = tl.arange(0, BLOCK_K2)
        xk2 = offs_k2[None, :] + 0 * offs_r2[:, None]
        kit = tl.cdiv(K2_4, BLOCK_K2)
        total = tl.cdiv(H, BLOCK_N2) * kit
        it = (pid * total) // nprog
        hi = ((pid + 1) * total) // nprog
        while it < hi:
            rb = it // kit
            kb = it % kit
            n_here = tl.minimum(hi - it, kit - kb)
            rows = rb * BLOCK_N2 + offs_r2
            rows_c = tl.minimum(rows, H - 1).to(tl.int64)
            w_ptrs = w_dn + rows_c[:, None] * stride_dn4 + offs_k2[None, :]
            acc = tl.zeros((BLOCK_N2, BLOCK_K2), dtype=tl.float32)
            k_stop = (kb + n_here) * BLOCK_K2
            if PIPE:
                wn = tl.load(w_ptrs + kb * BLOCK_K2, mask=((kb * BLOCK_K2 + xk2) < K2_4) | EVEN_K2, other=0)
            for k0 in range(kb * BLOCK_K2, k_stop, BLOCK_K2):
                kmask = ((k0 + xk2) < K2_4) | EVEN_K2
                if PIPE:
                    wv = wn
                    nmask = (k0 + BLOCK_K2 + xk2) < tl.minimum(k_stop, K2_4)
                    wn = tl.load(w_ptrs + k0 + BLOCK_K2, mask=nmask, other=0)
                else:
                    wv = tl.load(w_ptrs + k0, mask=kmask, other=0)
                x0, x1, x2, x3 = _x_quad(act64, 0, 0, k0 + xk2, kmask, X_SCALE)
                acc = _fma_words(acc, wv, x0, x1, x2, x3)
            v = tl.sum(acc, axis=1) * (tl.load(s_dn + rows_c) * UNDO)
            rmask = rows < H
            if n_here == kit:  # the whole row block here
                tl.store(y + rows, v.to(y.dtype.element_ty), mask=rmask)
            else:  # a share: add it in; whoever completes the row block writes y and clears the sums
                tl.atomic_add(y32 + rows, v, mask=rmask, sem="relaxed")
                tl.debug_barrier()
                done = tl.atomic_add(done2 + rb, n_here, sem="acq_rel") + n_here
                if done == kit:
                    tl.debug_barrier()
                    tot = tl.load(y32 + rows, mask=rmask, other=0.0, cache_modifier=".cg")
                    tl.store(y + rows, tot.to(y.dtype.element_ty), mask=rmask)
                    tl.store(y32 + rows, tl.zeros_like(tot), mask=rmask)
                    tl.atomic_xchg(done2 + rb, 0, sem="relaxed")
            it += n_here


@dataclass(frozen=True)
class MlpFp8M1Config:
    """Launch parameters. block_* powers of two; programs_per_sm is capped at what one SM holds for
    the compiled kernel (max_programs_per_sm); prefetch_k2 words (a multiple of 32, 0 = off) of each
    down row of a program's first phase-2 tile are prefetched into L2 before the barrier."""

    block_n1: int = 8
    block_k1: int = 128
    block_n2: int = 4
    block_k2: int = 512
    num_warps: int = 4
    programs_per_sm: int = 4
    prefetch_k2: int = 0
    pipe: bool = False  # each weight chunk loaded one loop step before it is used
    early_lines: int = 0  # 128-byte lines per row of the first tile prefetched into L2 before the PDL wait

    def __post_init__(self) -> None:
        for name in ("block_n1", "block_k1", "block_n2", "block_k2", "num_warps", "programs_per_sm"):
            v = getattr(self, name)
            check(v >= 1, f"{name} must be >= 1, got {v}")
        for name in ("block_n1", "block_k1", "block_n2", "block_k2"):
            v = getattr(self, name)
            check(v & (v - 1) == 0, f"{name} must be a power of two, got {v}")
        check(self.prefetch_k2 >= 0 and self.prefetch_k2 % 32 == 0,
              f"prefetch_k2 must be a multiple of 32 words, got {self.prefetch_k2}")


def max_programs_per_sm(n_regs: int, shared: int, num_warps: int, device: torch.device) -> int:
    """Programs of the compiled kernel one SM of `device` holds at once: registers (allocated per warp
    in units of 256), shared memory (plus 1 KB reserved per program) and warp slots. >= 0."""
    props = torch.cuda.get_device_properties(device)
    regs_per_sm = getattr(props, "regs_per_multiprocessor", 65536)
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
    warps_per_sm = getattr(props, "max_threads_per_multi_processor", 2048) // 32
    per_warp = -(-max(n_regs, 1) * 32 // 256) * 256
    by_regs = regs_per_sm // (per_warp * num_warps)
    by_smem = smem_per_sm // (shared + 1024)
    return max(0, min(by_regs, by_smem, warps_per_sm // num_warps, 32))


def supported(x: torch.Tensor, w_gu: torch.Tensor, w_dn: torch.Tensor) -> bool:
    """True when the fused kernel takes these operands: x [1, H] bf16 contiguous, w_gu [2I, H] and
    w_dn [H, I] e4m3 contiguous, H and I multiples of 4, 8-byte aligned x. Never raises."""
    if x.dim() != 2 or w_gu.dim() != 2 or w_dn.dim() != 2 or x.shape[0] != 1:
        return False
    h = x.shape[1]
    two_i = w_gu.shape[0]
    return (x.dtype == torch.bfloat16 and w_gu.dtype == FP8_DTYPE and w_dn.dtype == FP8_DTYPE
            and two_i % 2 == 0 and w_gu.shape[1] == h and tuple(w_dn.shape) == (h, two_i // 2)
            and h % 4 == 0 and (two_i // 2) % 4 == 0 and x.is_contiguous() and w_gu.is_contiguous()
            and w_dn.is_contiguous() and x.data_ptr() % 8 == 0)


class MlpFp8M1:
    """Runs the fused MLP with one config; owns its scratch per device: the barrier words, act [I]
    bf16, down's fp32 partial sums [H] and per-row-block counters (left zero by every launch), so
    calls are CUDA-graph safe after the first (which compiles and sizes the grid). One instance may
    serve every layer of a model: launches on one stream run one after another.
    `__call__(x, w_gu, s_gu, w_dn, s_dn, out=None)` -> y [1, H] bf16 (written into out when given).
    Raises ValueError for operands `supported` refuses. A barrier that gave up is reported by
    `check_barrier` (RuntimeError; it synchronizes)."""

    def __init__(self, config: MlpFp8M1Config | None = None) -> None:
        self.config = config or MlpFp8M1Config()
        self._scratch: dict[tuple, tuple[torch.Tensor, ...]] = {}
        self._grid: dict[tuple, int] = {}

    def _buffers(self, inter: int, h: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        key = (device.type, device.index)
        have = self._scratch.get(key)
        n_rb = triton.cdiv(h, self.config.block_n2)
        if have is None or have[1].numel() < inter or have[2].numel() < h or have[3].numel() < n_rb:
            self._scratch[key] = (torch.zeros(3, dtype=torch.int32, device=device),
                                  torch.empty(inter, dtype=torch.bfloat16, device=device),
                                  torch.zeros(h, dtype=torch.float32, device=device),
                                  torch.zeros(n_rb, dtype=torch.int32, device=device))
        return self._scratch[key]

    def check_barrier(self) -> None:
        """Raise RuntimeError if any launch's barrier gave up waiting (synchronizes)."""
        for bar, *_ in self._scratch.values():
            if int(bar[2].item()) != 0:
                raise RuntimeError("the fused MLP's grid barrier timed out: not every program was resident")

    def __call__(self, x: torch.Tensor, w_gu: torch.Tensor, s_gu: torch.Tensor, w_dn: torch.Tensor,
                 s_dn: torch.Tensor, out: torch.Tensor | None = None,
                 phase_programs: tuple[int, int] | None = None) -> torch.Tensor:
        """phase_programs (P1, P2): run the two phases as two launches of P1 and P2 programs, no
        barrier (the default off CUDA, where the Triton interpreter runs programs one by one); P2 = 0
        runs phase 1 alone and returns act [1, I] (a view of this instance's scratch)."""
        check(supported(x, w_gu, w_dn), "the fused FP8 MLP takes x [1, H] bf16 and contiguous e4m3 "
              "weights [2I, H], [H, I] with H, I multiples of 4")
        cfg = self.config
        h = x.shape[1]
        inter = w_gu.shape[0] // 2
        bar, act, y32, done2 = self._buffers(inter, h, x.device)
        act = act[:inter]
        if out is None:
            out = torch.empty((1, h), dtype=x.dtype, device=x.device)
        check(tuple(out.shape) == (1, h) and out.dtype == x.dtype and out.is_contiguous(),
              f"out must be a contiguous [1, {h}] {x.dtype} tensor")
        k1, k2 = h // 4, inter // 4
        bk1 = min(cfg.block_k1, triton.next_power_of_2(k1))
        bk2 = min(cfg.block_k2, triton.next_power_of_2(k2))
        if phase_programs is None and not x.is_cuda:
            phase_programs = (triton.cdiv(inter, cfg.block_n1), triton.cdiv(h, cfg.block_n2) * 2 + 1)
        pdl = use_pdl(x)
        args = (x.view(torch.int64), w_gu.view(torch.int32), s_gu, w_dn.view(torch.int32), s_dn,
                act, act.view(torch.int64), out, y32, done2, bar, inter, h, k1, k2, k1, k2)
        launches = [(0, None)] if phase_programs is None else [(1, phase_programs[0]), (2, phase_programs[1])]
        if phase_programs is not None and phase_programs[1] == 0:  # gate_up and SiLU only: act [1, I]
            launches, out = launches[:1], act.view(1, inter)
        for ph, programs in launches:
            kwargs = dict(BLOCK_N1=cfg.block_n1, BLOCK_K1=bk1, BLOCK_N2=cfg.block_n2, BLOCK_K2=bk2,
                          EVEN_K1=k1 % bk1 == 0, EVEN_K2=k2 % bk2 == 0, PHASE=ph,
                          PREFETCH_K2=0 if ph else min(cfg.prefetch_k2, triton.next_power_of_2(k2)),
                          PIPE=cfg.pipe, EARLY_LINES=cfg.early_lines if pdl else 0, USE_PDL=pdl,
                          num_warps=cfg.num_warps, num_stages=1)
            grid = programs if programs is not None else self._grid_size(args, kwargs, x.device)
            _mlp_fp8_m1_kernel[(grid,)](*args, **kwargs, **launch_options(pdl))
        return out

    def _grid_size(self, args: tuple, kwargs: dict, device: torch.device) -> int:
        key = (device.index, tuple(sorted(kwargs.items())))
        if key not in self._grid:
            opts = launch_options(kwargs["USE_PDL"])
            compiled = _mlp_fp8_m1_kernel.warmup(*args, **kwargs, **opts, grid=(1,))
            compiled._init_handles()  # loads the binary: n_regs is known from here on
            fit = max_programs_per_sm(compiled.n_regs, compiled.metadata.shared, self.config.num_warps,
                                      device)
            check(fit >= 1, "the fused FP8 MLP kernel does not fit on one SM")
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            self._grid[key] = sms * min(self.config.programs_per_sm, fit)
        return self._grid[key]


H, INTER = 3584, 18944
COPIES = 3
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


def grid() -> list[MlpFp8M1Config]:
    C = MlpFp8M1Config
    out = []
    for pps in (4, 6, 8):
        for pipe in (False, True):
            out.append(C(8, 128, 4, 512, 4, pps, 512, pipe))
    out += [C(4, 128, 4, 512, 4, 8, 512, True), C(4, 128, 2, 512, 4, 8, 512, True),
            C(8, 128, 4, 256, 4, 6, 512, True), C(4, 128, 4, 256, 4, 10, 512, True),
            C(8, 128, 4, 512, 4, 6, 0, True), C(8, 128, 4, 512, 4, 6, 1024, True),
            C(8, 256, 4, 512, 4, 4, 512, True), C(4, 256, 2, 1024, 4, 6, 512, True)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--configs", type=int, default=None, help="time only the first N persistent configs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    header = run_header()
    log(f"{header}")
    x = torch.randn(1, H, device=dev, dtype=torch.bfloat16)
    norm_w = torch.rand(H, device=dev, dtype=torch.bfloat16) + 0.5
    fp8, bf = [], []
    for c in range(COPIES):
        wgu = torch.randn(2 * INTER, H, device=dev, dtype=torch.bfloat16) * 0.02
        wdn = torch.randn(H, INTER, device=dev, dtype=torch.bfloat16) * 0.02
        fp8.append((*quantize_per_channel(wgu), *quantize_per_channel(wdn)))
        if c < 2:
            bf.append((wgu, wdn))
        del wgu, wdn
    torch.cuda.empty_cache()
    xn = rms_norm(x, norm_w, 1e-6)[0]

    def unfused(w, xin):
        return fp8_skinny_linear(silu_and_mul(fp8_skinny_linear(xin, w[0], w[1])), w[2], w[3])

    ref = unfused(fp8[0], xn)
    rows = []

    def timed(name, fn, ws, cfg=None):
        def run():
            for w in ws:
                fn(w, rms_norm(x, norm_w, 1e-6)[0])
        run()
        torch.cuda.synchronize()
        us = graph_ms(run, reps=4) * 1e3 / len(ws)
        mb = sum(t.numel() * t.element_size() for t in ws[0] if t.dim() == 2) / 1e6
        row = {"variant": name, "us": round(us, 2), "weight_MB": round(mb, 1), "TB_s": round(mb / us, 3)}
        if cfg is not None:
            row["config"] = cfg.__dict__
        rows.append(row)
        log(f"{name:58s} {us:8.2f} us  {row['TB_s']:.3f} TB/s")
        return us

    base = timed("unfused FP8 (int GEMV, SiLU, int GEMV)", unfused, fp8)
    timed("unfused bf16 (skinny GEMV, SiLU, skinny GEMV)",
          lambda w, xin: skinny_linear(silu_and_mul(skinny_linear(xin, w[0])), w[1]), bf)
    # the two phases as two launches (no barrier): phase 1 over every row tile (gate_up with SiLU in
    # its epilogue), phase 2 over every row block (down, one program per block) or stream-K shares
    C = MlpFp8M1Config
    for cfg, p2 in ((C(8, 128, 4, 512), None), (C(16, 128, 4, 512), None),
                    (C(8, 128, 4, 512, early_lines=4), None), (C(16, 128, 4, 512, early_lines=4), None),
                    (C(16, 128, 4, 512, early_lines=8), None), (C(8, 128, 4, 512, early_lines=16), None)):
        mlp = MlpFp8M1(cfg)
        pp = (-(-INTER // cfg.block_n1), p2 or -(-H // cfg.block_n2))
        y = mlp(xn, *fp8[0], phase_programs=pp)
        err = rel_err(y, ref)
        name = (f"two launches {cfg.block_n1}x{cfg.block_k1} ({pp[0]}) / "
                f"{cfg.block_n2}x{cfg.block_k2} ({pp[1]})")
        log(f"{name}: rel err {err:.2e}")
        timed(name + f" early {cfg.early_lines}", lambda w, xin, m=mlp, pp=pp: m(xin, *w, phase_programs=pp),
              fp8, cfg)
        # the engine's candidate: gate_up with SiLU in its epilogue, then the int GEMV's down
        y = fp8_skinny_linear(mlp(xn, *fp8[0], phase_programs=(pp[0], 0)), fp8[0][2], fp8[0][3])
        log(f"  + int GEMV down: rel err {rel_err(y, ref):.2e}")
        timed(f"gate_up+SiLU {cfg.block_n1}x{cfg.block_k1} early {cfg.early_lines}, int GEMV down",
              lambda w, xin, m=mlp, p1=pp[0]: fp8_skinny_linear(m(xin, *w, phase_programs=(p1, 0)),
                                                                 w[2], w[3]), fp8, cfg)
    best = None
    for cfg in grid()[:args.configs]:
        if time.time() - T0 > args.budget_s:
            log("budget spent")
            break
        mlp = MlpFp8M1(cfg)
        name = (f"fused {cfg.block_n1}x{cfg.block_k1} / {cfg.block_n2}x{cfg.block_k2} {cfg.num_warps}w "
                f"{cfg.programs_per_sm}/SM pf{cfg.prefetch_k2}{' pipe' if cfg.pipe else ''}")
        try:
            y = mlp(xn, *fp8[0])
            for _ in range(50):
                mlp(xn, *fp8[1])
            y2 = mlp(xn, *fp8[0])
            mlp.check_barrier()
        except Exception as exc:  # noqa: BLE001 - a lab grid: report and go on
            log(f"{name}: {type(exc).__name__}: {exc}")
            continue
        err = rel_err(y, ref)
        same = torch.equal(y, y2)
        grid_n = next(iter(mlp._grid.values()))
        log(f"{name}: rel err {err:.2e} against unfused, repeat equal {same}, grid {grid_n}")
        if not (err < 2e-2 and same):
            rows.append({"variant": name, "error": err, "repeat_equal": same})
            continue
        us = timed(name, lambda w, xin, m=mlp: m(xin, *w), fp8, cfg)
        rows[-1].update(rel_err=err, grid=grid_n)
        mlp.check_barrier()
        if best is None or us < best[0]:
            best = (us, name)
    if best:
        log(f"best fused {best[1]}: {best[0]:.2f} us against unfused {base:.2f} ({best[0] / base:.3f}x)")
    write_json(out_path(args.out, "fused-mlp-m1.json"), {"header": header, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
