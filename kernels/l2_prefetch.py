"""Stream the first bytes of a tensor into L2 (the batch-1 decode step's weight prefetch, issue 19).

At batch 1 the decode step reads its weights at ~4 TB/s inside the linears, while between them the
small kernels (rotary, K/V store, attention, merge: ~10 us per layer on an H200) leave DRAM almost
idle. `prefetch_l2`, launched on a second stream during those kernels, loads the next linears'
weights with an L2 evict_last hint and keeps nothing, so the linear then finds them in L2. Measured
premise (H200, 2026-12-03, bench/lab/l2_prefetch_lab.py, docs/benchmarks.md "Weights prefetched into
L2"): after an 18.5 us kernel with a side-stream prefetch of the whole o weight, the FP8 int GEMV of
o ended 2.6 us earlier (bf16: 3.1 us), gate_up with its first 32 MB prefetched 4.7-4.9 us earlier;
48 MB was slower (the L2 holds ~50 MB in two halves). In the engine's batch-1 step it did not pay
(bf16 2.1% slower, FP8 unchanged within its rounds), so the model's L2Prefetch is off by default.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_MAGIC = tl.constexpr(0x7EADBEEF)  # the xor a program stores: never in practice (1 in 2^32 per program)
PREFETCH_WORDS = 4096  # int32 words (16 KB) per program


@triton.jit
def _l2_prefetch_kernel(src, sink, n_words, WORDS: tl.constexpr):
    """Load words [pid * WORDS, (pid + 1) * WORDS) of src (int32, < n_words) into L2 (evict_last).
    Their xor is stored to sink[pid] only when it equals _MAGIC, so the loads are kept and nothing is
    written in practice."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * WORDS + tl.arange(0, WORDS)
    v = tl.load(src + offs, mask=offs < n_words, other=0, eviction_policy="evict_last")
    x = tl.xor_sum(v, axis=0)
    tl.store(sink + pid, x, mask=x == _MAGIC)


def prefetch_programs(nbytes: int) -> int:
    """Programs `prefetch_l2` launches for nbytes (the sink needs at least this many int32)."""
    return triton.cdiv(max(0, nbytes) // 4, PREFETCH_WORDS)


def prefetch_l2(t: torch.Tensor, nbytes: int, sink: torch.Tensor) -> None:
    """Load the whole 4-byte words among the first min(nbytes, t's bytes) bytes of contiguous `t` (any
    dtype, 4-byte aligned start) into L2; `sink` is an int32 tensor of >= prefetch_programs(nbytes)
    elements on t's device (written only in the 2^-32 case above). Shapes only: CUDA-graph safe.
    Raises ValueError on a non-contiguous or misaligned t or a short sink."""
    if not t.is_contiguous() or t.data_ptr() % 4:
        raise ValueError("prefetch_l2 needs a contiguous tensor starting on a 4-byte boundary")
    n = min(t.numel() * t.element_size(), max(0, nbytes)) // 4
    programs = triton.cdiv(n, PREFETCH_WORDS)
    if programs == 0:
        return
    if sink.dtype != torch.int32 or sink.numel() < programs or sink.device != t.device:
        raise ValueError(f"sink must be >= {programs} int32 on {t.device}")
    words = t.view(-1).view(torch.uint8)[: n * 4].view(torch.int32)
    _l2_prefetch_kernel[(programs,)](words, sink, n, WORDS=PREFETCH_WORDS, num_warps=4)
