"""Linear layers whose decode-sized calls can use the Triton skinny GEMM (kernels/gemv.py).

A batch-1 decode step is a chain of matrix-vector products that must stream every weight once;
cuBLAS reaches ~2.8-3.9 TB/s on the H200 for the 7B shapes and adds a split-K reduce kernel to the
small ones. Calls on CUDA that `radixrt.kernels.skinny_linear_supported` accepts (at most 16 rows;
up to SKINNY_MAX_ROWS = 256 rows only for the weight shapes whose TUNED entry shows the kernel
beating cuBLAS there) go to `radixrt.kernels.skinny_linear` (single-launch deterministic split-K)
instead, unless RADIXRT_SKINNY_GEMM=0; everything else is `torch.nn.functional.linear`. Measured on
the H200 (docs/benchmarks.md): the 7B batch-1 decode step 4.65 -> 4.25 ms with the launcher's
default configs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
from torch import nn

# Most rows skinny_linear_supported may route (= radixrt.kernels.gemv.MAX_M_DOT); each Linear bounds
# its calls by the rows routed for its own shape (_routed_rows), the per-call decision is
# skinny_linear_supported's.
SKINNY_MAX_ROWS = 256


def skinny_enabled() -> bool:
    from radixrt.config import Env

    return Env.read().skinny_gemm


class Linear(nn.Linear):
    """nn.Linear (weight [N, K], optional bias [N]); x [..., K] -> [..., N] in x's dtype."""

    _workspace = None  # SkinnyWorkspace, allocated at the first skinny call (shapes only)
    _max_rows = None  # largest M routed to skinny_linear for this weight shape (from TUNED; cached)
    _skinny = skinny_enabled()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the per-shape bound keeps calls of 17..256 rows, routed nowhere unless TUNED lists the shape,
        # off skinny_linear_supported's per-call checks (eager mixed passes make ~110 such calls)
        if self._skinny and x.is_cuda and x.dim() == 2 and x.shape[0] <= self._routed_rows():
            from radixrt.kernels import skinny_linear, skinny_linear_supported

            if skinny_linear_supported(x, self.weight):
                return skinny_linear(x, self.weight, self.bias, workspace=self._scratch(x.device))
        return F.linear(x, self.weight, self.bias)

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
        first)."""
        if self._workspace is None:
            from radixrt.kernels.gemv import SkinnyWorkspace, default_config, skinny_rows_routed

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
            self._workspace = SkinnyWorkspace.allocate(partials, counters, device)
        return self._workspace
