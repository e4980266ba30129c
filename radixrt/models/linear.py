"""Linear layers whose decode-sized calls can use the Triton skinny GEMM (kernels/gemv.py).

A batch-1 decode step is a chain of matrix-vector products that must stream every weight once;
cuBLAS reaches ~2.8-3.9 TB/s on the H200 for the 7B shapes and adds a split-K reduce kernel to the
small ones. Calls on CUDA that `radixrt.kernels.skinny_linear_supported` accepts (at most 16 rows;
up to SKINNY_MAX_ROWS = 256 rows only for the weight shapes whose TUNED entry shows the kernel
beating cuBLAS there) go to `radixrt.kernels.skinny_linear` (single-launch deterministic split-K)
instead, unless RADIXRT_SKINNY_GEMM=0; everything else is `torch.nn.functional.linear`. Measured on
the H200 (docs/benchmarks.md): the 7B batch-1 decode step 4.65 -> 4.25 ms with the launcher's
default configs.

On CPU, bfloat16 calls (every row count) and float32 calls of CPU_PACKED_ROWS rows go through
oneDNN's linear with the weight reordered once into its blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`, the packed-weight path torch's own CPU inductor uses),
unless RADIXRT_CPU_PACKED_LINEAR=0. Which rows depends on the CPU vendor (`cpu_packed_rows`): MKL,
the BLAS behind F.linear, is Intel's and runs its slower code paths on other vendors' CPUs. On an
Intel Xeon MKL is as fast or faster at 1 row and at prefill sizes, so only the decode regime (2..128
rows) is packed there; on an AMD EPYC (Zen 4, AVX-512) oneDNN took 0.40-0.75x MKL's time at every
size measured, 1 to 1,832 rows, so every row count is packed there (docs/kernels.md, "CPU linears").
bf16 has no MKL path to prefer (F.linear's bf16 calls re-read an unpacked weight: a 4-request decode
step of the default model took 0.57x the float32 step's linear time packed, and more than the
float32 step unpacked, on an AMD EPYC with AVX512-BF16). MKL's sgemm reads a [N, K] weight several
times over for a few rows (the 49152 x 576 LM head at 4 rows: 4.9 GB/s against 12 GB/s at 1 row);
the packed call keeps the weight read near one pass. The packed copies are made when the model is
loaded (`prepack_cpu_linears`: ~0.5 s for the default model, which would otherwise land on the first
request) and again whenever a weight changes (its version counter or storage), and cost a second
copy of the weights in host memory.

Before both, float32 CPU calls of NATIVE_LINEAR_ROWS (1..128) rows take the native kernel
(`radixrt.worker.cpu_native.linear`, kernels/cpu_native_gemm.h: a register-blocked AVX-512 GEMM over
a weight packed in 32-column panels, each panel read from memory once per call with the next ones
prefetched under the arithmetic) where `native_linear_enabled()`: RADIXRT_CPU_NATIVE_LINEAR "auto"
(default) on Intel CPUs with AVX-512, "1" on any CPU with AVX-512, "0" never. On the 2-vCPU Xeon VM of
2026-12-02 it ran the default model's layer at 0.51-0.75x oneDNN's packed time at 1-64 rows (MKL at 1
row: 0.78x) and lost above ~256 rows (docs/kernels.md, "CPU linears"); it was not measured on AMD
CPUs, hence "auto". Its packed copy replaces oneDNN's where oneDNN would take no calls.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
import triton
from torch import nn

from radixrt.models import ops

# Most rows skinny_linear_supported may route (= radixrt.kernels.gemv.MAX_M_DOT); each Linear bounds
# its calls by the rows routed for its own shape (_routed_rows), the per-call decision is
# skinny_linear_supported's.
SKINNY_MAX_ROWS = 256

# Decode-graph calls (worker/cuda_graph.py's warm-up and capture, inside `decode_graph_calls`) of
# GEMM_WS_ROWS rows may take the Gluon GEMM on Hopper (kernels/gemm_ws.py; RADIXRT_GEMM_WS): a graph
# pays its launches' host cost (two TMA descriptors) once, an eager pass would pay it at every call.
GEMM_WS_ROWS = range(17, 129)  # = kernels/gemm_ws.py MIN_M..MAX_M
_graph_calls = 0  # > 0 inside decode_graph_calls
_gemm_ws_mode = "0"  # RADIXRT_GEMM_WS as read when the outermost decode_graph_calls was entered
_gemm_ws_scratch: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # (partials, counters)
_gemm_ws_retired: list[tuple[torch.Tensor, torch.Tensor]] = []  # outgrown scratch that graphs may hold


@contextlib.contextmanager
def decode_graph_calls():
    """Marks the calls inside as a decode CUDA graph's (its eager warm-up and its capture): Linear
    calls of GEMM_WS_ROWS rows may then take kernels/gemm_ws.py's kernel (module docstring), as
    RADIXRT_GEMM_WS says when the outermost such block is entered."""
    global _graph_calls, _gemm_ws_mode
    if not _graph_calls:
        from radixrt.config import Env

        _gemm_ws_mode = Env.read().gemm_ws
    _graph_calls += 1
    try:
        yield
    finally:
        _graph_calls -= 1


def _gemm_ws_workspace(device: torch.device, partials: int, counters: int):
    """The split-K scratch that every Linear's gemm_ws calls on `device` share (calls are sequential on
    one stream; each leaves the counters at zero), grown outside a capture: returns None when it is too
    small during a capture. Outgrown tensors stay alive: a graph captured earlier still uses them."""
    have = _gemm_ws_scratch.get(device)
    if have is not None and have[0].numel() >= partials and have[1].numel() >= counters:
        return have
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    if have is not None:
        _gemm_ws_retired.append(have)
        partials, counters = max(partials, have[0].numel()), max(counters, have[1].numel())
    have = (torch.empty(max(partials, 1), dtype=torch.float32, device=device),
            torch.zeros(max(counters, 1), dtype=torch.int32, device=device))
    _gemm_ws_scratch[device] = have
    return have


def cpu_vendor() -> str:
    """The CPU's vendor id from /proc/cpuinfo ("GenuineIntel", "AuthenticAMD", ...), "" where there is
    no such file (not Linux) or no vendor_id line."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def cpu_packed_rows(vendor: str) -> range:
    """Row counts of float32 CPU calls that take oneDNN with a packed weight (module docstring): the
    decode regime 2..128 on Intel CPUs (and where the vendor is unknown), every row count elsewhere."""
    return range(2, 129) if vendor in ("GenuineIntel", "") else range(1, 1 << 62)


CPU_PACKED_ROWS = cpu_packed_rows(cpu_vendor())

# Rows of float32 CPU calls that take the native linear where it is enabled (module docstring)
NATIVE_LINEAR_ROWS = range(1, 129)
_native_on: bool | None = None


def native_linear_enabled() -> bool:
    """Whether float32 CPU calls of NATIVE_LINEAR_ROWS rows take the native linear (module docstring):
    RADIXRT_CPU_NATIVE_LINEAR allows it on this CPU and the native library loads with AVX-512 (which
    compiles it on the first call of the machine). Decided once per process."""
    global _native_on
    if _native_on is None:
        from radixrt.config import Env

        setting = Env.read().cpu_native_linear
        _native_on = False
        if setting == "1" or (setting == "auto" and cpu_vendor() == "GenuineIntel"):
            from radixrt.worker import cpu_native

            _native_on = cpu_native.linear_supported()
    return _native_on


def skinny_enabled() -> bool:
    from radixrt.config import Env

    return Env.read().skinny_gemm


def cpu_packed_enabled() -> bool:
    """RADIXRT_CPU_PACKED_LINEAR is not 0 and this torch build has oneDNN (mkldnn)."""
    from radixrt.config import Env

    return Env.read().cpu_packed_linear and torch.backends.mkldnn.is_available()


class Linear(nn.Linear):
    """nn.Linear (weight [N, K], optional bias [N]); x [..., K] -> [..., N] in x's dtype."""

    _workspace = None  # SkinnyWorkspace, allocated at the first skinny call (shapes only)
    _max_rows = None  # largest M routed to skinny_linear for this weight shape (from TUNED; cached)
    _skinny = skinny_enabled()
    _cpu_packed = cpu_packed_enabled()
    _packed = None  # (weight key, oneDNN packed weight) for float32 and bf16 CPU calls (module docstring)
    _native = None  # (weight key, native packed weight) for float32 CPU calls (module docstring)
    # a fused [gate; up] weight [2I, K] (the MLP's gate_up_proj, set by the model): `silu_and_mul` is
    # its caller, and the native weight prepacked for it is `cpu_native.pack_gate_up`'s
    gated = False
    _native_gated = None  # (weight key, cpu_native.pack_gate_up weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _graph_calls and x.is_cuda and x.dim() == 2 and x.shape[0] in GEMM_WS_ROWS:
            y = self._gemm_ws(x)
            if y is not None:
                return y
        # the per-shape bound keeps calls of 17..256 rows, routed nowhere unless TUNED lists the shape,
        # off skinny_linear_supported's per-call checks (eager mixed passes make ~110 such calls)
        if self._skinny and x.is_cuda and x.dim() == 2 and x.shape[0] <= self._routed_rows():
            from radixrt.kernels import skinny_linear, skinny_linear_supported

            if skinny_linear_supported(x, self.weight):
                return skinny_linear(x, self.weight, self.bias, workspace=self._scratch(x.device))
        elif x.device.type == "cpu" and x.dim() == 2 and x.dtype == self.weight.dtype:
            if x.dtype == torch.float32 and x.shape[0] in NATIVE_LINEAR_ROWS and native_linear_enabled():
                from radixrt.worker import cpu_native

                return cpu_native.linear(x.contiguous(), self._native_weight(), self.out_features, self.bias)
            if self._cpu_packed and (x.dtype == torch.bfloat16 or (x.dtype == torch.float32
                                                                    and x.shape[0] in CPU_PACKED_ROWS)):
                return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight(), self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def _gemm_ws(self, x: torch.Tensor, gated: bool = False) -> torch.Tensor | None:
        """This decode-graph call through kernels/gemm_ws.py where RADIXRT_GEMM_WS and its TUNED table
        route it and its `supported` accepts it, else None (the caller goes on as before). gated: the
        SwiGLU of this [gate; up] weight in the same launch (`gemm_silu_ws`, no bias, one split), routed
        by TUNED_GATED instead: a shape whose plain GEMM is in TUNED may still run its SiLU apart."""
        mode = _gemm_ws_mode
        if mode == "0" or type(self).forward is not Linear.forward:
            return None
        try:
            from radixrt.kernels import gemm_ws as G
        except (ImportError, AttributeError):  # a Triton without Gluon's Hopper API
            return None
        bias = self.bias
        if not G.supported(x, self.weight):
            return None
        if bias is not None and (bias.dtype != x.dtype or bias.stride(0) != 1):
            return None
        n, k = self.weight.shape
        m = x.shape[0]
        shape = (G.rows_padded(m), n, k)
        if gated:  # the SwiGLU form only where it was measured faster (TUNED_GATED) or in mode "all"
            if bias is not None or n % 2 or (mode != "all" and shape not in G.TUNED_GATED):
                return None
            cfg = G.TUNED_GATED.get(shape)
            if cfg is None:
                sms = torch.cuda.get_device_properties(x.device).multi_processor_count
                d = G.default_config(m, n, k, sms)
                cfg = G.GemmWsConfig(d.block_n, d.block_k, d.stages, 1)
            if not G.fits(cfg, shape[0]):
                return None
            return G.gemm_silu_ws(x, self.weight, config=cfg)
        if mode != "all" and shape not in G.TUNED:
            return None
        cfg = G.default_config(m, n, k, torch.cuda.get_device_properties(x.device).multi_processor_count)
        if not G.fits(cfg, shape[0]):  # a TUNED entry that does not fit: not this kernel's call
            return None
        scratch = _gemm_ws_workspace(x.device, *G.workspace_need(cfg, m, n, k))
        if scratch is None:
            return None
        return G.gemm_ws(x, self.weight, self.bias, config=cfg, partials=scratch[0], counters=scratch[1])

    def takes_fp8_input(self, rows: int, device: torch.device) -> bool:
        """Whether `forward` takes an `Fp8Act` (activations its producer's kernel quantized per token,
        models/quant/fp8.py) for a call of `rows` rows on `device`. Never for a plain Linear; an
        Fp8Linear says yes where it would quantize its input itself. Never raises."""
        return False

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU of this Linear's fused [gate; up] weight [2I, K]: x [M, K] -> silu(x Wg^T) * (x Wu^T)
        [M, I], i.e. `ops.silu_and_mul(self(x))`. Decode-graph calls that `_gemm_ws` routes are one
        Gluon launch with the product in its epilogue (`kernels.gemm_ws.gemm_silu_ws`). Float32 CPU
        calls of NATIVE_LINEAR_ROWS rows without a bias, where the native linear is enabled and
        forward is not overridden, are one native GEMM with the SiLU and the product in its epilogue
        (`cpu_native.linear_silu`: the [M, 2I] output is never written, nor read back by a second
        call); every other call is that expression."""
        if _graph_calls and x.is_cuda and x.dim() == 2 and x.shape[0] in GEMM_WS_ROWS:
            y = self._gemm_ws(x, gated=True)
            if y is not None:
                return y
        if (x.device.type == "cpu" and x.dim() == 2 and x.dtype == torch.float32
                and self.weight.dtype == torch.float32 and self.bias is None
                and x.shape[0] in NATIVE_LINEAR_ROWS and type(self).forward is Linear.forward
                and native_linear_enabled()):
            from radixrt.worker import cpu_native

            return cpu_native.linear_silu(x.contiguous(), self._native_gated_weight(), self.out_features // 2)
        return ops.silu_and_mul(self(x))

    def _native_gated_weight(self) -> torch.Tensor:
        """The weight packed for `cpu_native.linear_silu`, made again when the weight changed."""
        key = self._key()
        if self._native_gated is None or self._native_gated[0] != key:
            from radixrt.worker import cpu_native

            self._native_gated = (key, cpu_native.pack_gate_up(self.weight))
        return self._native_gated[1]

    def _key(self) -> tuple[int, int | None]:
        w = self.weight
        return (w.data_ptr(), None if w.is_inference() else w._version)

    def _native_weight(self) -> torch.Tensor:
        """The weight packed for the native linear (`cpu_native.pack_linear`), made again when the
        weight's storage or version counter changed since the last call."""
        key = self._key()
        if self._native is None or self._native[0] != key:
            from radixrt.worker import cpu_native

            self._native = (key, cpu_native.pack_linear(self.weight))
        return self._native[1]

    def _packed_weight(self) -> torch.Tensor:
        """The weight in oneDNN's blocked layout (an opaque mkldnn tensor, [N, K] float32), made again
        when the weight's storage or version counter changed since the last call."""
        key = self._key()
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, torch.ops.mkldnn._reorder_linear_weight(self.weight.detach()))
        return self._packed[1]

    def _routed_rows(self) -> int:
        """The largest M <= SKINNY_MAX_ROWS that skinny_rows_routed accepts for this weight's shape
        (16 unless TUNED lists larger row buckets for it); computed once."""
        if self._max_rows is None:
            from radixrt.kernels.gemv import skinny_rows_routed

            n, k = self.weight.shape
            routed = (m for m in range(1, SKINNY_MAX_ROWS + 1) if skinny_rows_routed(m, n, k))
            self._max_rows = max(routed, default=0)
        return self._max_rows

    def _scratch(self, device: torch.device):
        """Split-K scratch (fp32 partials >= splits * M * N, int32 counters >= row blocks) big enough
        for every row count M <= SKINNY_MAX_ROWS that skinny_linear may be given for this weight
        shape (skinny_rows_routed: M <= 16, and larger M only where TUNED lists the shape), with the
        configs skinny_linear picks (default_config at this device's SM count). Depends only on
        shapes and TUNED; allocated once, outside any graph capture (the graph warm-up calls come
        first). An FP8 weight's scratch also covers the int GEMV's configs at the rows it takes
        (kernels/gemv_fp8_int.py int_routed: M <= FP8_INT_MAX_ROWS; split-K ones need partials)."""
        if self._workspace is None:
            from radixrt.kernels.gemv import SkinnyWorkspace, default_config, skinny_rows_routed
            from radixrt.kernels.gemv_fp8_int import FP8_INT_MAX_ROWS, int_routed, int_workspace_need

            n, k = self.weight.shape
            num_sms = (torch.cuda.get_device_properties(device).multi_processor_count
                       if device.type == "cuda" else 132)
            partials = counters = 1
            for m in range(1, SKINNY_MAX_ROWS + 1):
                if not skinny_rows_routed(m, n, k):
                    continue
                cfg = default_config(m, n, k, num_sms)
                k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
                partials = max(partials, triton.cdiv(k, k_per_split) * m * n)
                counters = max(counters, triton.cdiv(n, cfg.block_n))
            if self.weight.dtype == torch.float8_e4m3fn:
                for m in range(1, FP8_INT_MAX_ROWS + 1):
                    int_cfg = int_routed(m, n, k, device.type)
                    if int_cfg is not None:
                        need_p, need_c = int_workspace_need(int_cfg, m, n, k)
                        partials, counters = max(partials, need_p), max(counters, need_c)
            self._workspace = SkinnyWorkspace.allocate(partials, counters, device)
        return self._workspace


def prepack_cpu_linears(model: nn.Module) -> int:
    """Make the packed weights of every float32 or bf16 CPU `Linear` in `model` now (module docstring),
    so that the first decode pass does not pay for them: the native one for float32 where the native
    linear is enabled, oneDNN's where some row counts will take it (bf16; float32 rows of
    CPU_PACKED_ROWS beyond NATIVE_LINEAR_ROWS, or all of them without the native linear). Returns how
    many Linears were packed (0 when both paths are off or the model is not a float32 or bf16 CPU one)."""
    native = native_linear_enabled()
    dnn_f32 = (not native or CPU_PACKED_ROWS.start < NATIVE_LINEAR_ROWS.start
               or CPU_PACKED_ROWS.stop > NATIVE_LINEAR_ROWS.stop)
    n = 0
    for m in model.modules():
        if not (isinstance(m, Linear) and m.weight.device.type == "cpu"
                and m.weight.dtype in (torch.float32, torch.bfloat16)):
            continue
        f32 = m.weight.dtype == torch.float32
        if f32 and native:
            m._native_gated_weight() if m.gated and m.bias is None else m._native_weight()
        if m._cpu_packed and (not f32 or dnn_f32):
            m._packed_weight()
        n += int((f32 and native) or (m._cpu_packed and (not f32 or dnn_f32)))
    return n
