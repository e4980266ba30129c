"""Paged K/V storage: per layer, one K and one V buffer of `num_pages * page_size` token slots.

slot = page * page_size + offset. Page 0 is reserved: it is the sink that padded tokens (CUDA-graph
padding) write to, and no real request ever reads it. The scheduler owns which pages are in use;
this pool only stores tensors and performs the copies a ForwardBatch asks for (copy-on-write).
How many pages fit on a device is decided in memory_profile.py.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# prefault_step: bytes touched per call (a pass that arrives during a slice waits for it): on the 2-core
# VM a median of 0.3 ms, 1 in 100 over 6 ms (the host maps fresh memory lazily too)
PREFAULT_SLICE_BYTES = 512 << 10
OS_PAGE_BYTES = 4096


class PagedKVPool:
    """K/V buffers `[num_slots, num_kv_heads, head_dim]` per layer (implements attention.base.KVPool).

    Args:
        num_pages: pages including the reserved page 0.
        page_size: tokens per page.
        num_layers, num_kv_heads, head_dim: model shape.
        dtype, device: storage dtype and device. For torch.float8_e4m3fn (--kv-cache-dtype fp8_e4m3)
            the pool holds K / k_scales[layer] and V / v_scales[layer] (per-tensor, per-layer float
            scales, 1.0 until `set_kv_scales`); the Triton kernels quantize and dequantize with them.
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
        self.k_buffers = [_zeros(shape, dtype, device) for _ in range(num_layers)]
        self.v_buffers = [_zeros(shape, dtype, device) for _ in range(num_layers)]
        self.k_scales = [1.0] * num_layers
        self.v_scales = [1.0] * num_layers
        # first slot whose memory page `prefault_step` has not written yet (CPU pools only)
        self.prefault_next = 0 if self.device.type == "cpu" else num_slots

    def prefault_step(self, max_bytes: int = PREFAULT_SLICE_BYTES) -> bool:
        """Write once into the not yet touched OS pages of the next slots of every buffer, about
        `max_bytes` in all, keeping their contents (each page's first byte is read and written back);
        returns True while slots remain. CPU pools come from calloc, so the OS maps a page only at its
        first write, and on the 2-core VM of docs/memory.md ("First touch") that first write made a
        cold 1,832-token prefill 13% slower; the worker calls this between passes while idle. Not
        thread-safe against a pass: call it only while no pass runs."""
        buffers = self.k_buffers + self.v_buffers
        if self.prefault_next >= self.num_slots or not buffers:
            return False
        row = buffers[0][0].numel() * buffers[0].element_size()  # bytes per slot
        a = self.prefault_next
        b = min(self.num_slots, a + max(1, max_bytes // (row * len(buffers))))
        for buf in buffers:
            flat = buf.view(-1).view(torch.uint8)  # contiguous: slot s is bytes [s * row, (s + 1) * row)
            flat[a * row:b * row:OS_PAGE_BYTES].add_(0)  # one byte in each OS page of the range
        self.prefault_next = b
        return b < self.num_slots

    def set_kv_scales(self, scales: dict[int, dict[str, float]]) -> None:
        """Per-layer FP8 scales {layer: {"k": s, "v": s}} (missing entries stay 1.0); set before the
        first pass (CUDA graphs bake them in). Raises ValueError on a scale that is not finite and
        > 0, or a layer the model does not have."""
        for layer, kv in scales.items():
            if not 0 <= layer < self.num_layers:
                raise ValueError(f"KV-cache scales for layer {layer} of a {self.num_layers}-layer model")
            if not all(math.isfinite(v) and v > 0 for v in kv.values()):
                raise ValueError(f"KV-cache scales of layer {layer} must be finite and > 0, got {kv}")
            self.k_scales[layer] = float(kv.get("k", self.k_scales[layer]))
            self.v_scales[layer] = float(kv.get("v", self.v_scales[layer]))

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

    @property
    def page_bytes_per_buffer(self) -> int:
        """Bytes of one page in one K or V buffer (page_size * num_kv_heads * head_dim * itemsize)."""
        return self.page_size * self.num_kv_heads * self.head_dim * self.k_buffers[0].element_size()

    def page_views(self) -> list[torch.Tensor]:
        """Byte views of the buffers, K of layers 0..L-1 then V of layers 0..L-1: 2 * num_layers
        tensors `[num_pages, page_bytes_per_buffer]` of torch.uint8 sharing the buffers' storage
        (row p = page p). For page copies of any dtype (FP8 included: bytes are bytes)."""
        return [buf.view(torch.uint8).view(self.num_pages, self.page_bytes_per_buffer)
                for buf in (*self.k_buffers, *self.v_buffers)]

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
            if buf.element_size() == 1:  # FP8: indexing kernels need not exist for it, bytes are bytes
                buf = buf.view(torch.uint8)
            pages = buf.view(self.num_pages, ps, self.num_kv_heads, self.head_dim)  # [P, ps, Hkv, D]
            pages[dst] = pages[src]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Zeroed storage; 1-byte (FP8) dtypes are zeroed as bytes (+0.0 is the all-zero pattern).

    On the CPU the bytes come from calloc (np.zeros): the kernel hands out zero pages as they are
    first written, where torch.zeros would memset the whole pool at start (a 1.5 GiB pool cost ~3 s
    of CPU time and its full resident size before the first request)."""
    if torch.device(device).type == "cpu":
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)
    if torch.empty((), dtype=dtype).element_size() == 1 and dtype.is_floating_point:
        return torch.zeros(shape, dtype=torch.uint8, device=device).view(dtype)
    return torch.zeros(shape, dtype=dtype, device=device)
