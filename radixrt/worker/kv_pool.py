"""Paged K/V storage: per layer, one K and one V buffer of `num_pages * page_size` token slots.

slot = page * page_size + offset. Page 0 is reserved: it is the sink that padded tokens (CUDA-graph
padding) write to, and no real request ever reads it. The scheduler owns which pages are in use;
this pool only stores tensors and performs the copies a ForwardBatch asks for (copy-on-write).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class PagedKVPool:
    """K/V buffers `[num_slots, num_kv_heads, head_dim]` per layer (implements forward_meta.KVPool).

    Args:
        num_pages: pages including the reserved page 0.
        page_size: tokens per page.
        num_layers, num_kv_heads, head_dim: model shape.
        dtype, device: storage dtype and device.
    """

    def __init__(self, num_pages: int, page_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        if num_pages < 2:
            raise ValueError("the KV pool needs at least 2 pages (page 0 is reserved)")
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        num_slots = num_pages * page_size
        shape = (num_slots, num_kv_heads, head_dim)
        self.k_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def usable_tokens(self) -> int:
        """Slots a request may use (all but the reserved page 0)."""
        return (self.num_pages - 1) * self.page_size

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """K + V bytes of one token over all layers."""
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def kv_bytes_per_token(self) -> int:
        return self.bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes_per_token * self.num_slots

    def copy_pages(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the K/V of whole pages src[i] -> dst[i] in every layer (copy-on-write).

        Args:
            src, dst: [C] integer page ids on the pool's device; dst pages must be distinct from src.
        """
        if src.numel() == 0:
            return
        src = src.to(self.device, torch.int64)
        dst = dst.to(self.device, torch.int64)
        ps = self.page_size
        for buf in (*self.k_buffers, *self.v_buffers):
            pages = buf.view(self.num_pages, ps, self.num_kv_heads, self.head_dim)  # [P, ps, Hkv, D]
            pages[dst] = pages[src]


# --------------------------------------------------------------------------- CUDA sizing
GIB = 1 << 30
MIN_SLACK_BYTES = 512 << 20  # allocator fragmentation, cuBLAS/Triton workspaces, NCCL later


def measure_peak_bytes(run: Callable[[], object], device: torch.device) -> int:
    """Peak extra CUDA memory (bytes) allocated while `run()` executes; frees what it cached."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    run()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    torch.cuda.empty_cache()
    return max(0, peak)


def cuda_pool_tokens(device: torch.device, mem_fraction_static: float, kv_bytes_per_token: int,
                     activation_reserve_bytes: int, page_size: int) -> int:
    """Tokens of KV pool that fit on `device`, called after the weights are loaded.

    mem_fraction_static is the share of the device's total memory for weights + KV pool (as in
    SGLang); what is already in use (weights, CUDA context, other processes) counts against it.
    The pool is also capped so that `activation_reserve_bytes` stays free for the forward passes.

    Raises:
        RuntimeError: less than two pages would fit (message says which flag to change).
    """
    free, total = torch.cuda.mem_get_info(device)
    used = total - free
    budget = min(int(total * mem_fraction_static) - used, free - activation_reserve_bytes)
    tokens = (max(0, budget) // kv_bytes_per_token) // page_size * page_size
    if tokens < 2 * page_size:
        raise RuntimeError(
            f"no GPU memory left for the KV pool: {used / GIB:.1f} GiB in use of {total / GIB:.1f} GiB, "
            f"activations need {activation_reserve_bytes / GIB:.2f} GiB; raise --mem-fraction-static "
            "or lower --chunked-prefill-size / --max-running-requests")
    return tokens
