"""The token bitmask: allocation (scheduler side) and application to the logits (worker side).

Layout (xgrammar's): int32 [R, W] with W = ceil(vocab_size / 32); bit j % 32 of word j // 32 of a
row is 1 when token j is allowed. A ForwardBatch carries the rows of its constrained requests only,
with `rows` giving each one's row in the logits [B, V].

The worker applies it after penalties and logit_bias, before temperature / top-k / top-p, so that
no later step can move probability back onto a disallowed token. Logit columns the bitmask does not
describe (V > vocab_size: LM-head padding, or V > 32 * W) are set to -inf in constrained rows too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch


def bitmask_width(vocab_size: int) -> int:
    """int32 words per bitmask row: ceil(vocab_size / 32)."""
    return (vocab_size + 31) // 32


def allocate_bitmask(num_rows: int, vocab_size: int) -> np.ndarray:
    """A C-contiguous int32 [num_rows, bitmask_width(vocab_size)] array, all tokens allowed (-1)."""
    return np.full((num_rows, bitmask_width(vocab_size)), -1, dtype=np.int32)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor | np.ndarray,
                        rows: Sequence[int] | torch.Tensor | np.ndarray | None = None, *,
                        vocab_size: int | None = None,
                        backend: Literal["auto", "xgrammar", "torch"] = "auto") -> None:
    """Set logits[rows[r], j] = -inf wherever bit j of bitmask[r] is 0, in place.

    logits: float32/float16/bfloat16 [B, V] on CPU or CUDA (rows must be contiguous in V).
    bitmask: int32 [R, W], any device (copied to logits' device); rows: R distinct indices into B
    (default range(R)). vocab_size: ids the bitmask describes (default min(V, 32 * W)); columns at
    or past it are set to -inf in the given rows. Allowed logits are left bit-for-bit unchanged.
    backend: "xgrammar" uses its CPU / Triton kernels, "torch" a masked_fill, "auto" tries
    xgrammar and falls back to torch. Raises ValueError on shape or dtype mismatches.
    """
    mask = torch.as_tensor(bitmask)
    num_rows, width = _check_shapes(logits, mask)
    if num_rows == 0:
        return
    row_list = list(range(num_rows)) if rows is None else [int(r) for r in torch.as_tensor(rows).tolist()]
    if len(row_list) != num_rows:
        raise ValueError(f"rows has {len(row_list)} entries for {num_rows} bitmask rows")
    covered = min(logits.shape[1], 32 * width, vocab_size if vocab_size is not None else 1 << 62)
    mask = mask.to(logits.device, non_blocking=True)
    if backend in ("auto", "xgrammar"):
        try:
            _apply_xgrammar(logits, mask, row_list, covered)
        except (ImportError, RuntimeError, ValueError, AssertionError):
            if backend == "xgrammar":
                raise
            _apply_torch(logits, mask, row_list, covered)
    elif backend == "torch":
        _apply_torch(logits, mask, row_list, covered)
    else:
        raise ValueError(f"unknown backend {backend!r}")
    if covered < logits.shape[1]:
        logits[torch.tensor(row_list, device=logits.device), covered:] = float("-inf")


def _check_shapes(logits: torch.Tensor, mask: torch.Tensor) -> tuple[int, int]:
    if logits.dim() != 2 or not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be a float [B, V] tensor, got {logits.dtype} {tuple(logits.shape)}")
    if mask.dim() != 2 or mask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32 [R, W], got {mask.dtype} {tuple(mask.shape)}")
    if mask.shape[0] > logits.shape[0]:
        raise ValueError(f"bitmask has {mask.shape[0]} rows for {logits.shape[0]} logits rows")
    return int(mask.shape[0]), int(mask.shape[1])


def _apply_xgrammar(logits: torch.Tensor, mask: torch.Tensor, rows: list[int], covered: int) -> None:
    """xgrammar's kernels index the bitmask and the logits by the same row, so scatter the compact
    rows into a full-batch bitmask (allow-all elsewhere) unless they already line up."""
    import xgrammar as xgr

    if logits.stride(1) != 1:
        raise ValueError("logits rows must be contiguous")
    if rows == list(range(len(rows))):
        xgr.apply_token_bitmask_inplace(logits[:len(rows)], mask, vocab_size=covered)
        return
    full = torch.full((logits.shape[0], mask.shape[1]), -1, dtype=torch.int32, device=logits.device)
    full[torch.tensor(rows, device=logits.device)] = mask
    xgr.apply_token_bitmask_inplace(logits, full, vocab_size=covered, indices=rows)


def _apply_torch(logits: torch.Tensor, mask: torch.Tensor, rows: list[int], covered: int) -> None:
    """Unpack the bits and masked_fill: [R, W] -> [R, W, 32] -> [R, 32 * W][:, :covered]."""
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((mask.unsqueeze(-1) >> shifts) & 1).reshape(mask.shape[0], -1)[:, :covered].bool()
    idx = torch.tensor(rows, device=logits.device)
    logits[idx, :covered] = logits[idx, :covered].masked_fill(~allowed, float("-inf"))
