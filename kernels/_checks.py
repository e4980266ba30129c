"""Small helpers shared by the kernel launchers (argument checks, block-size arithmetic)."""

from __future__ import annotations

import torch

from . import switches

# The FP8 format of quantized weights, activations and KV pools (e4m3, no infinities) and its
# largest finite value.
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


def check(cond: bool, msg: str) -> None:
    """Raise ValueError(msg) unless cond holds (launchers validate shapes before launching)."""
    if not cond:
        raise ValueError(msg)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (and >= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def check_int_vector(t: torch.Tensor, name: str, length: int) -> None:
    """`t` must be an int32/int64 vector of `length` elements (batch metadata)."""
    check(t.dim() == 1 and t.shape[0] == length, f"{name} must be [{length}], got {tuple(t.shape)}")
    check(t.dtype in (torch.int32, torch.int64), f"{name} must be int32 or int64, got {t.dtype}")


def check_pool(k_buffer: torch.Tensor, v_buffer: torch.Tensor, num_kv_heads: int, head_dim: int) -> None:
    """Pool buffers of one layer must be [S, Hkv, D] with a contiguous last dim and match each other."""
    check(k_buffer.dim() == 3 and k_buffer.shape == v_buffer.shape,
          f"k_buffer {tuple(k_buffer.shape)} / v_buffer {tuple(v_buffer.shape)} must be equal [S, Hkv, D]")
    check(tuple(k_buffer.shape[1:]) == (num_kv_heads, head_dim),
          f"pool rows are {tuple(k_buffer.shape[1:])}, expected ({num_kv_heads}, {head_dim})")
    check(k_buffer.stride(-1) == 1 and v_buffer.stride(-1) == 1, "pool buffers need a contiguous last dim")
    check(k_buffer.dtype == v_buffer.dtype, "k_buffer and v_buffer dtypes differ")


def check_page_size(page_size: int) -> None:
    """page_size is a positive int; kernels take it as a compile-time constant (one build per size)."""
    check(isinstance(page_size, int) and page_size >= 1, f"page_size must be an int >= 1, got {page_size!r}")


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot input precision: exact fp32 products for fp32 inputs (not tf32); native for fp16/bf16."""
    return "ieee" if dtype == torch.float32 else "tf32"


def gluon_route_open(q: torch.Tensor, switched_on: bool, int32: tuple[torch.Tensor, ...],
                     scales: tuple[float, ...]) -> bool:
    """The conditions every route to a Gluon kernel shares (extend_attention_ws, cascade_prefix_ws,
    decode_attention_ws): the caller's switch on, CUDA tensors, not Triton's interpreter, int32
    metadata (the kernels index their rings with it) and the given scales 1.0 (the extend and cascade
    kernels' pools are never FP8; the decode kernel passes none, it applies them). The caller adds
    its kernel's own checks."""
    if not switched_on or not q.is_cuda or switches.interpreting():
        return False
    return all(t.dtype == torch.int32 for t in int32) and all(float(s) == 1.0 for s in scales)
