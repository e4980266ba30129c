"""Linear layers whose decode-sized calls can use the Triton skinny GEMM (kernels/gemv.py).

A batch-1 decode step is a chain of matrix-vector products that must stream every weight once;
cuBLAS reaches ~2.8-3.9 TB/s on the H200 for the 7B shapes and adds a split-K reduce kernel to the
small ones. Calls with at most SKINNY_MAX_ROWS rows on CUDA go to `radixrt.kernels.skinny_linear`
(single-launch deterministic split-K) instead, unless RADIXRT_SKINNY_GEMM=0; everything else is
`torch.nn.functional.linear`. Measured on the H200 (docs/benchmarks.md): the 7B batch-1 decode step
4.65 -> 4.25 ms with the launcher's default configs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
from torch import nn

SKINNY_MAX_ROWS = 16


def skinny_enabled() -> bool:
    from radixrt.config import Env

    return Env.read().skinny_gemm


class Linear(nn.Linear):
    """nn.Linear (weight [N, K], optional bias [N]); x [..., K] -> [..., N] in x's dtype."""

    _workspace = None  # SkinnyWorkspace, allocated at the first skinny call (shapes only)
    _skinny = skinny_enabled()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._skinny and x.is_cuda and x.dim() == 2 and x.shape[0] <= SKINNY_MAX_ROWS:
            from radixrt.kernels import skinny_linear, skinny_linear_supported

            if skinny_linear_supported(x, self.weight):
                return skinny_linear(x, self.weight, self.bias, workspace=self._scratch(x.device))
        return F.linear(x, self.weight, self.bias)

    def _scratch(self, device: torch.device):
        """Split-K scratch big enough for every row count up to SKINNY_MAX_ROWS with the default
        configs; allocated once, outside any graph capture (the graph warm-up calls come first)."""
        if self._workspace is None:
            from radixrt.kernels.gemv import SkinnyWorkspace, default_config

            n, k = self.weight.shape
            partials = counters = 1
            for m in range(1, SKINNY_MAX_ROWS + 1):
                cfg = default_config(m, n, k)
                k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
                partials = max(partials, triton.cdiv(k, k_per_split) * m * n)
                counters = max(counters, triton.cdiv(n, cfg.block_n))
            self._workspace = SkinnyWorkspace.allocate(partials, counters, device)
        return self._workspace
