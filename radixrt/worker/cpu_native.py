"""The native CPU attention kernel (`kernels/cpu_native.c` + `cpu_native_unit.h`): compiled once per
machine, called via ctypes.

`load()` compiles it (the sources are found in the `radixrt.kernels` package folder without importing
that package, which would import Triton) with the system C compiler (`cc -O3 -march=native -fopenmp
-shared`) into `~/.cache/radixrt/native/` (`RADIXRT_NATIVE_DIR` overrides the folder), the file named
by the hash of the sources, the compiler flags and this CPU's model and feature flags, and loads it.
It returns None, once logging why, when there is no compiler, the compile fails, or
`RADIXRT_CPU_NATIVE=0`; callers then keep their torch path. The library links `libgomp.so.1`, which
resolves to the copy torch has already loaded, so the kernel's OpenMP loops use torch's intra-op
threads (`torch.set_num_threads`).

`decode_attention(q, k_buf, v_buf, plan, scale) -> out` runs one layer of a pass's rows (decodes and
short extends); a `DecodePlan` (built once per pass from slot lists by `DecodePlan.build`) holds the
items and the merge lists as int64 numpy arrays. `rms_norm` is RMSNorm with its residual add;
`pack_linear` / `linear` the float32 linear of small passes (`kernels/cpu_native_gemm.h`, AVX-512
only: `linear_supported`).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from radixrt.config import Env

log = logging.getLogger(__name__)


def _source() -> Path:
    spec = importlib.util.find_spec("radixrt.kernels")
    assert spec is not None and spec.submodule_search_locations
    return Path(list(spec.submodule_search_locations)[0]) / "cpu_native.c"


_FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC"]
_lib: ctypes.CDLL | None = None
_tried = False

# Items longer than this are split into pieces (more units for the threads; merged by log-sum-exp).
SPLIT_TOKENS = 512


def _cache_dir() -> Path:
    return Env.read().native_dir or Path.home() / ".cache" / "radixrt" / "native"


def _cpu_flags() -> str:
    """This CPU's model name and feature flags (Linux /proc/cpuinfo), or the platform's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    keep = [ln for ln in lines if ln.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(keep))  # one copy per distinct line (every core repeats them)


def _compile() -> ctypes.CDLL | None:
    cc = Env.read().cc or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.info("native CPU kernels off: no C compiler found")
        return None
    src_path = _source()
    src = b"".join(f.read_bytes() for f in sorted(src_path.parent.glob("cpu_native*.[ch]")))
    # -march=native: the library is only valid on CPUs with this one's instruction sets
    key = hashlib.sha256(src + " ".join([cc, *_FLAGS, _cpu_flags()]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"cpu_native-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_so = Path(tmp) / out.name
            r = subprocess.run([cc, *_FLAGS, str(src_path), "-o", str(tmp_so), "-lm"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                log.warning("native CPU kernels off: %s failed: %s", cc, r.stderr.strip()[-500:])
                return None
            os.replace(tmp_so, out)  # atomic: concurrent workers / test processes race safely
    lib = ctypes.CDLL(str(out))
    fn = lib.radixrt_decode_attention
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    fn.argtypes = [p, i64, p, p, i32, i64, i64, i64, i64, p, p, p, p, p, p, p, p, f32, p, p, i64, p, p, p]
    fn.restype = ctypes.c_int
    fn = lib.radixrt_rms_norm
    fn.argtypes = [p, p, p, p, p, i64, i64, f32]
    fn.restype = None
    lib.radixrt_linear_f32_supported.argtypes = []
    lib.radixrt_linear_f32_supported.restype = ctypes.c_int
    lib.radixrt_pack_linear_f32.argtypes = [p, p, i64, i64]
    lib.radixrt_pack_linear_f32.restype = None
    lib.radixrt_linear_f32.argtypes = [p, p, p, p, i64, i64, i64, p]
    lib.radixrt_linear_f32.restype = ctypes.c_int
    lib.radixrt_pack_gate_up_f32.argtypes = [p, p, i64, i64]
    lib.radixrt_pack_gate_up_f32.restype = None
    lib.radixrt_linear_silu_f32.argtypes = [p, p, p, i64, i64, i64, p]
    lib.radixrt_linear_silu_f32.restype = ctypes.c_int
    lib.radixrt_rotary_f32.argtypes = [p, i64, i64, i64, i64, p, p]
    lib.radixrt_rotary_f32.restype = None
    lib.radixrt_silu_mul_f32.argtypes = [p, p, i64, i64]
    lib.radixrt_silu_mul_f32.restype = None
    lib.radixrt_store_kv_f32.argtypes = [p, p, p, p, i64, p, i64, i64]
    lib.radixrt_store_kv_f32.restype = None
    return lib


def load() -> ctypes.CDLL | None:
    """The compiled kernel library, or None (see the module docstring). Compiles at most once per process."""
    global _lib, _tried
    if not _tried:
        _tried = True
        if Env.read().cpu_native:
            try:
                _lib = _compile()
            except OSError as e:
                log.warning("native CPU kernels off: %s", e)
                _lib = None
    return _lib


def supports(k_buf: torch.Tensor) -> bool:
    """Whether the kernel takes this pool buffer: CPU, float32 or bfloat16, head_dim a multiple of 16
    up to 256, contiguous."""
    d = k_buf.shape[-1]
    return (k_buf.device.type == "cpu" and k_buf.dtype in (torch.float32, torch.bfloat16)
            and d % 16 == 0 and d <= 256 and k_buf.is_contiguous())


# (slots [n] int64, member rows[, causal]): one item of a DecodePlan
Item = tuple[np.ndarray, list[int]] | tuple[np.ndarray, list[int], bool]


@dataclass(slots=True)
class DecodePlan:
    """A pass's native attention work (int64 arrays): items (slot lists and the query rows, of decodes
    and short extends, that attend them; a causal item's m-th of M members attends only its first
    n - M + m + 1 slots), their partial outputs, and each row's partials to merge.
    Rows are 0..n_rows-1 in the order of `q_rows` (the rows of the pass's q)."""

    q_rows: torch.Tensor  # [n_rows] int64 rows of q
    slots: np.ndarray  # [sum of item tokens] int64
    item_slot_off: np.ndarray
    item_ntok: np.ndarray
    item_mem_off: np.ndarray
    item_nmem: np.ndarray
    item_part_off: np.ndarray
    item_causal: np.ndarray  # 1: a causal item
    mem_row: np.ndarray
    row_part_ptr: np.ndarray
    row_parts: np.ndarray
    n_parts: int
    all_rows: bool  # q_rows is 0..n_rows-1: the plan covers every row of q, in order
    # per (Hq, D): the float32 scratch (part_o, part_lse, out) and the kernel's pointer arguments that
    # do not change between layers; made at the first layer's call, reused by the others
    _scratch: dict | None = None

    @staticmethod
    def build(q_rows: list[int], items: list[Item], split_tokens: int = SPLIT_TOKENS) -> DecodePlan:
        """`items`: (slots [n] int64, member rows as indices into q_rows[, causal]) tuples; each item
        with n >= 1 (and, causal, n >= its members). Items longer than `split_tokens` become pieces of
        at most that many tokens; causal items stay whole."""
        slot_parts, slot_off, ntok, mem_off, nmem, part_off, mem_row = [], [], [], [], [], [], []
        causal_flags: list[int] = []
        row_parts: list[list[int]] = [[] for _ in q_rows]
        off = moff = parts = 0
        for slots, members, *flag in items:
            causal = bool(flag and flag[0])
            if causal and len(slots) < len(members):
                raise ValueError(f"a causal item of {len(members)} members has only {len(slots)} slots")
            step = len(slots) if causal else split_tokens
            for a in range(0, len(slots), step):
                piece = slots[a:a + step]
                causal_flags.append(int(causal))
                slot_parts.append(piece)
                slot_off.append(off)
                ntok.append(len(piece))
                off += len(piece)
                mem_off.append(moff)
                nmem.append(len(members))
                part_off.append(parts)
                mem_row.extend(members)
                moff += len(members)
                for m, r in enumerate(members):
                    row_parts[r].append(parts + m)
                parts += len(members)
        ptr = np.zeros(len(q_rows) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(x) for x in row_parts])

        def i64(x: list[int]) -> np.ndarray:
            return np.asarray(x, dtype=np.int64)

        return DecodePlan(
            q_rows=torch.tensor(q_rows, dtype=torch.int64),
            slots=np.ascontiguousarray(np.concatenate(slot_parts).astype(np.int64, copy=False))
            if slot_parts else np.zeros(0, dtype=np.int64),
            item_slot_off=i64(slot_off), item_ntok=i64(ntok), item_mem_off=i64(mem_off), item_nmem=i64(nmem),
            item_part_off=i64(part_off), item_causal=i64(causal_flags), mem_row=i64(mem_row),
            row_part_ptr=ptr, row_parts=i64([p for x in row_parts for p in x]), n_parts=parts,
            all_rows=q_rows == list(range(len(q_rows))))


def _ptr(a: np.ndarray | torch.Tensor) -> int:
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data_ptr()


def plan_args(plan: DecodePlan, hq: int, d: int) -> tuple[torch.Tensor, tuple, tuple]:
    """The plan's float32 scratch for Hq heads of D and the kernel's pointer arguments (made at the first
    call for (hq, d), then reused): (buf [n_rows, hq, d], the 9 item arguments that follow `d`, the 6
    arguments that follow `scale`, the last of them `buf`'s pointer, the output)."""
    if plan._scratch is None:
        plan._scratch = {}
    scratch = plan._scratch.get((hq, d))
    if scratch is None:
        n_rows = plan.q_rows.numel()
        part_o = torch.empty(plan.n_parts, hq, d, dtype=torch.float32)
        part_lse = torch.empty(plan.n_parts, hq, dtype=torch.float32)
        buf = torch.empty(n_rows, hq, d, dtype=torch.float32)
        items = (len(plan.item_ntok), _ptr(plan.item_slot_off), _ptr(plan.item_ntok), _ptr(plan.item_mem_off),
                 _ptr(plan.item_nmem), _ptr(plan.item_part_off), _ptr(plan.item_causal), _ptr(plan.mem_row),
                 _ptr(plan.slots))
        rest = (_ptr(part_o), _ptr(part_lse), n_rows, _ptr(plan.row_part_ptr), _ptr(plan.row_parts),
                _ptr(buf))
        scratch = plan._scratch[(hq, d)] = (buf, items, rest, (part_o, part_lse))
    return scratch[0], scratch[1], scratch[2]


def decode_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, plan: DecodePlan,
                     scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of the plan's rows: q [T, Hq, D] (any float dtype; rows plan.q_rows), pool
    buffers [slots, Hkv, D] float32 or bfloat16 (`supports`) -> [n_rows, Hq, D] float32: `out` when
    given (float32, contiguous, [n_rows, Hq, D]), else a buffer of the plan that the next call with the
    same plan overwrites (copy it out first). When the plan's rows are all of q's in order
    (`plan.all_rows`) and q is float32 with contiguous heads ([T, Hq, D] with strides (any, D, 1): the
    q columns of a fused QKV output), the kernel reads q in place; else it gathers the rows first.
    Raises RuntimeError when the library is not loaded or rejects the shapes."""
    lib = load()
    if lib is None:
        raise RuntimeError("native CPU decode attention is not available")
    n_rows, hq, d = plan.q_rows.numel(), q.shape[1], q.shape[2]
    hkv = k_buf.shape[1]
    buf, items, rest = plan_args(plan, hq, d)
    if out is not None:
        if out.dtype != torch.float32 or not out.is_contiguous() or out.shape != (n_rows, hq, d):
            raise ValueError(f"decode_attention: out {tuple(out.shape)} {out.dtype}, want "
                             f"[{n_rows}, {hq}, {d}] float32 contiguous")
        rest = (*rest[:-1], _ptr(out))
    else:
        out = buf
    if (plan.all_rows and q.dtype == torch.float32 and q.shape[0] == n_rows and q.stride(2) == 1
            and q.stride(1) == d):
        qd = q  # read in place, rows q.stride(0) floats apart
    else:
        qd = q.index_select(0, plan.q_rows)
        if qd.dtype != torch.float32:
            qd = qd.float()
    rc = lib.radixrt_decode_attention(_ptr(qd), qd.stride(0), _ptr(k_buf), _ptr(v_buf),
                                      int(k_buf.dtype == torch.bfloat16), hq, hkv, d, *items, scale, *rest)
    if rc != 0:
        raise RuntimeError(f"native CPU decode attention rejected head_dim {d}")
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm with the residual add fused, float32 CPU tensors: x [..., H] (and residual [..., H])
    contiguous, weight [H] -> (out, new residual = x + residual, or x itself when residual is None),
    float32 as `models.ops.rms_norm`. One C loop instead of torch's add + ~5 ops (15 us a call at
    [4, 576] on the 2-core Zen 4 VM). Raises RuntimeError when the library is not loaded."""
    lib = load()
    if lib is None:
        raise RuntimeError("native CPU kernels are not available")
    h = x.shape[-1]
    out = torch.empty_like(x)
    new_res = None if residual is None else torch.empty_like(x)
    lib.radixrt_rms_norm(x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(),
                         out.data_ptr(), None if new_res is None else new_res.data_ptr(), x.numel() // h, h,
                         eps)
    return out, (x if new_res is None else new_res)


def takes_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """Whether `rms_norm` takes these tensors (float32, CPU, contiguous) and the library is loaded."""
    return (x.dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu"
            and x.is_contiguous() and weight.is_contiguous()
            and (residual is None or (residual.dtype == torch.float32 and residual.is_contiguous()
                                      and residual.shape == x.shape))
            and _lib is not None)


# Panel width of the packed linear weight (GEMM_NR in kernels/cpu_native_gemm.h)
LINEAR_PANEL = 32


def linear_supported() -> bool:
    """Whether the native float32 linear is available: the library loads and was built with AVX-512."""
    lib = load()
    return lib is not None and bool(lib.radixrt_linear_f32_supported())


def pack_linear(w: torch.Tensor) -> torch.Tensor:
    """The packed form of a float32 CPU weight w [N, K] for `linear`: a new float32 tensor of
    ceil(N / 32) * K * 32 elements, column panels of 32 outputs [panel][K][32], zero past N.
    Raises RuntimeError when `linear_supported()` is False, ValueError for another dtype or shape."""
    if not linear_supported():
        raise RuntimeError("the native CPU linear is not available (no library, or no AVX-512)")
    if w.dim() != 2 or w.dtype != torch.float32 or w.device.type != "cpu":
        raise ValueError(f"pack_linear takes a float32 CPU [N, K] weight, got {tuple(w.shape)} {w.dtype} "
                         f"{w.device}")
    w = w.detach().contiguous()
    n, k = w.shape
    wp = torch.empty(-(-n // LINEAR_PANEL) * k * LINEAR_PANEL, dtype=torch.float32)
    assert wp.data_ptr() % 64 == 0  # the kernel's aligned panel loads (torch's CPU allocator: 64 bytes)
    _lib.radixrt_pack_linear_f32(w.data_ptr(), wp.data_ptr(), n, k)
    return wp


def linear(x: torch.Tensor, wp: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [M, n] = x [M, K] W^T (+ bias [n]) in float32, with wp = `pack_linear(W)` (W [n, K]); x float32,
    contiguous, M >= 1. One OpenMP-parallel call over column panels (torch's intra-op threads); W is
    read from memory once per call (kernels/cpu_native_gemm.h). Meant for M up to ~128 (decodes,
    short extends): larger M runs, but the large-GEMM libraries are faster there.
    Raises RuntimeError when the library is not loaded, ValueError for bad shapes or dtypes."""
    lib = _lib
    if lib is None:
        raise RuntimeError("native CPU kernels are not available")
    m, k = x.shape
    if (x.dtype != torch.float32 or not x.is_contiguous() or m < 1
            or wp.numel() != -(-n // LINEAR_PANEL) * k * LINEAR_PANEL
            or (bias is not None and (bias.dtype != torch.float32 or bias.numel() != n
                                      or not bias.is_contiguous()))):
        raise ValueError(f"native linear: x {tuple(x.shape)} {x.dtype}, packed weight of {wp.numel()} "
                         f"for N = {n}")
    y = torch.empty(m, n, dtype=torch.float32)
    xp = torch.empty(m * k, dtype=torch.float32)
    lib.radixrt_linear_f32(x.data_ptr(), wp.data_ptr(), None if bias is None else bias.data_ptr(),
                           y.data_ptr(), m, n, k, xp.data_ptr())
    return y


def pack_gate_up(w: torch.Tensor) -> torch.Tensor:
    """The packed form of a fused float32 CPU [gate; up] weight w [2I, K] (gate rows, then up rows) for
    `linear_silu`: a new float32 tensor of ceil(I / 16) * K * 32 elements, panels [panel][K][32] whose
    columns 0-15 are gate rows 16p..16p+15 and 16-31 the same up rows (zero past I).
    Raises RuntimeError when `linear_supported()` is False, ValueError for another dtype or shape."""
    if not linear_supported():
        raise RuntimeError("the native CPU linear is not available (no library, or no AVX-512)")
    if w.dim() != 2 or w.dtype != torch.float32 or w.device.type != "cpu" or w.shape[0] % 2:
        raise ValueError(f"pack_gate_up takes a float32 CPU [2I, K] weight, got {tuple(w.shape)} {w.dtype} "
                         f"{w.device}")
    w = w.detach().contiguous()
    n, k = w.shape[0] // 2, w.shape[1]
    half = LINEAR_PANEL // 2
    wp = torch.empty(-(-n // half) * k * LINEAR_PANEL, dtype=torch.float32)
    assert wp.data_ptr() % 64 == 0  # the kernel's aligned panel loads (torch's CPU allocator: 64 bytes)
    _lib.radixrt_pack_gate_up_f32(w.data_ptr(), wp.data_ptr(), n, k)
    return wp


def linear_silu(x: torch.Tensor, wp: torch.Tensor, n: int) -> torch.Tensor:
    """SwiGLU through the native linear: y [M, n] = silu(x Wg^T) * (x Wu^T) in float32 for x [M, K]
    float32 contiguous (M >= 1) and wp = `pack_gate_up([Wg; Wu])` (Wg, Wu [n, K]): the same GEMM as
    `linear`, with the SiLU and the product in its epilogue, so the [M, 2n] gate_up output is never
    written (what `linear` then `silu_and_mul` compute, to float32 rounding: the epilogue's exp is
    exp16's polynomial, as `silu_and_mul`'s). Raises RuntimeError when the library is not loaded,
    ValueError for bad shapes or dtypes."""
    lib = _lib
    if lib is None:
        raise RuntimeError("native CPU kernels are not available")
    m, k = x.shape
    half = LINEAR_PANEL // 2
    if (x.dtype != torch.float32 or not x.is_contiguous() or m < 1
            or wp.numel() != -(-n // half) * k * LINEAR_PANEL):
        raise ValueError(f"native linear_silu: x {tuple(x.shape)} {x.dtype}, packed weight of {wp.numel()} "
                         f"for I = {n}")
    y = torch.empty(m, n, dtype=torch.float32)
    xp = torch.empty(m * k, dtype=torch.float32)
    lib.radixrt_linear_silu_f32(x.data_ptr(), wp.data_ptr(), y.data_ptr(), m, n, k, xp.data_ptr())
    return y


def rotary_(x: torch.Tensor, nh: int, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """The rotary embedding (NeoX "rotate-half" layout, as `models.ops.apply_rotary`) in place on the
    first `nh` heads of each row of x [T, H, D] float32 (H >= nh; strides (any, D, 1): the q|k columns
    of a fused QKV output), at positions [T] int64 (contiguous) with cos_sin_cache [max_positions, D]
    float32 contiguous (cos in [:D/2], sin in [D/2:]). One C loop for q and k of a layer (torch: 3 ops
    and the table's gather). Raises RuntimeError when the library is not loaded."""
    lib = _lib
    if lib is None:
        raise RuntimeError("native CPU kernels are not available")
    lib.radixrt_rotary_f32(x.data_ptr(), x.shape[0], x.stride(0), nh, x.shape[2], positions.data_ptr(),
                           cos_sin_cache.data_ptr())


def takes_rotary(q: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> bool:
    """Whether `rotary_` takes these tensors: float32 CPU, heads contiguous, an even head dim, int64
    contiguous positions, a float32 contiguous table of the same head dim, and the library loaded."""
    return (_lib is not None and q.dtype == torch.float32 and q.device.type == "cpu" and q.stride(2) == 1
            and q.stride(1) == q.shape[2] and q.shape[2] % 2 == 0 and positions.dtype == torch.int64
            and positions.is_contiguous() and cos_sin_cache.dtype == torch.float32
            and cos_sin_cache.is_contiguous() and cos_sin_cache.shape[-1] == q.shape[2])


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU: x [T, 2I] float32 contiguous CPU -> silu(x[:, :I]) * x[:, I:] [T, I] float32, one C
    loop (torch: chunk, silu, mul). Raises RuntimeError when the library is not loaded."""
    lib = _lib
    if lib is None:
        raise RuntimeError("native CPU kernels are not available")
    t, n = x.shape[0], x.shape[1] // 2
    out = torch.empty(t, n, dtype=torch.float32)
    lib.radixrt_silu_mul_f32(x.data_ptr(), out.data_ptr(), t, n)
    return out


def store_kv(k_buf: torch.Tensor, v_buf: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> bool:
    """k_buf[slots] = k, v_buf[slots] = v in one C loop, when they qualify: float32 CPU pool buffers
    [S, Hkv, D] contiguous, k and v [T, Hkv, D] float32 with contiguous rows and the same row stride
    (the k and v columns of a fused QKV output), slots [T] int64 contiguous, each below S (not checked:
    the scheduler's allocator gives them). Returns False, storing
    nothing, when they do not qualify (the caller stores through torch) or the library is not loaded."""
    lib = _lib
    w = k_buf.shape[1] * k_buf.shape[2]
    if (lib is None or k_buf.dtype != torch.float32 or v_buf.dtype != torch.float32
            or k.dtype != torch.float32 or v.dtype != torch.float32 or k.stride() != v.stride()
            or k.stride(2) != 1
            or k.stride(1) != k.shape[2] or k.shape[1] * k.shape[2] != w or v.shape != k.shape
            or slots.dtype != torch.int64 or not slots.is_contiguous() or slots.numel() != k.shape[0]
            or not k_buf.is_contiguous() or not v_buf.is_contiguous()):
        return False
    lib.radixrt_store_kv_f32(k_buf.data_ptr(), v_buf.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0),
                             slots.data_ptr(), slots.numel(), w)
    return True
