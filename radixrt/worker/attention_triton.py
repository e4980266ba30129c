"""CUDA attention backend: Triton paged-attention kernels from `radixrt.kernels`.

Per pass: `prepare(meta)` once, then `forward(q, k, v, layer_id, scale)` per layer, which stores the
new K/V into the pool at meta.out_cache_loc and then attends:
  DECODE         -> decode_attention (split-KV, Flash-Decoding), one query token per request;
                    with meta.cascade (groups sharing prefix pages): cascade_decode_attention,
                    which reads each group's prefix once (graph-capturable: cuda_graph.py)
  EXTEND / MIXED -> extend_attention (prefix through the page table + causal over the new tokens)

CUDA graphs (decode): forward does no host synchronisation, and its only allocation is the output,
whose size depends on the batch size alone. The split workspace is allocated once, for every batch
size up to `max_batch_size`, and handed to the kernel as views. The number of KV splits is a host
int chosen in `prepare` from (batch size, meta.max_seq_len) and baked into a captured graph, as is
the split stage's launch variant (kernels' launch_config: a bf16 pool's warp count for many
programs, an FP8 pool's config for many short splits or for long ones, which decode_attention picks
from max_seq_len); the pair is `decode_graph_key`, so cuda_graph.py captures
one graph per distinct pair over its length classes and replays the one chosen for the batch's real
longest sequence. The kernel clips the split ranges
to each row's seq_len on the device, so any replay is exact; a split count chosen for a much longer
sequence only runs empty programs (and a wider merge).
"""

from __future__ import annotations

import torch

from radixrt.attention.base import AttentionBackend, ForwardMeta, KVPool
from radixrt.config import Env
from radixrt.kernels import (
    cascade_decode_attention,
    choose_num_kv_splits,
    choose_num_prefix_splits,
    decode_attention,
    extend_attention,
    rope_store_kv,
    store_kv,
)
from radixrt.kernels.cascade_attention import default_tile
from radixrt.kernels.decode_attention import decode_launch_variant
from radixrt.protocol import ForwardMode

DEFAULT_NUM_SMS = 132  # H200; used when the pool is not on a CUDA device
# A cascade pass whose suffix ranges ([kv_start, seq_len) of grouped requests, whole sequences of the
# others) are all at most this long runs each (request, KV head) suffix in a single program, which
# also merges the prefix partials: two launches per layer instead of three (cascade_attention.py).
CASCADE_FUSED_MAX_SUFFIX = 512
# The fused form caps the prefix splits at this many: its suffix program unrolls the merge over them,
# and more slots cost more than they save (H200, 2026-11-30, 128 requests x 2,048 shared + 128-192
# own tokens, profiler: three launches 26.6 + 20.6 + 9.3 us; fused with 4 splits 19.9 + 19.1 us;
# fused with 5 splits, 8 unrolled slots, a 28.5 us suffix, no better than split + merge)
CASCADE_FUSED_MAX_PREFIX_SPLITS = 4


class TritonAttnBackend(AttentionBackend):
    """AttentionBackend over a paged KV pool (see attention.base.AttentionBackend for the contract).

    kv_pool            : object with page_size and per-layer k_buffers / v_buffers [S, Hkv, D]; an
                         FP8 (float8_e4m3fn) pool also has per-layer float k_scales / v_scales
                         (worker/kv_pool.py; 1.0 when absent), which store_kv and the attention
                         kernels apply (read per call, so set them before capturing graphs)
    q_dtype            : dtype of q / k / v (the model's); default the pool's, which must then not
                         be FP8
    num_q_heads        : if given, the decode workspace is allocated now (else at the first decode)
    max_batch_size     : largest decode batch served from the preallocated workspace (larger
                         batches still work but allocate their workspace per call: not graph-safe)
    max_num_kv_splits  : upper bound on the split count of the decode kernel
    cascade_fused_max_suffix : longest suffix range of a cascade pass that runs fused (one suffix
                         split merging the prefix itself); 0 disables the fused form; None (default)
                         takes CASCADE_FUSED_MAX_SUFFIX
    The backend keeps a reference to the last prepared ForwardMeta; its tensors must stay alive and
    unchanged until the pass's last forward (in-place updates between graph replays are fine).
    """

    def __init__(self, kv_pool: KVPool, num_q_heads: int | None = None, max_batch_size: int = 256,
                 max_num_kv_splits: int = 64, cascade_fused_max_suffix: int | None = None,
                 q_dtype: torch.dtype | None = None) -> None:
        self.kv_pool = kv_pool
        self.cascade_fused_max_suffix = (CASCADE_FUSED_MAX_SUFFIX if cascade_fused_max_suffix is None
                                         else cascade_fused_max_suffix)
        self.page_size = int(kv_pool.page_size)
        k0 = kv_pool.k_buffers[0]
        self.num_kv_heads, self.head_dim = int(k0.shape[1]), int(k0.shape[2])
        self.device = k0.device
        self.q_dtype = k0.dtype if q_dtype is None else q_dtype
        if self.q_dtype == torch.float8_e4m3fn:
            raise ValueError("an FP8 KV pool needs q_dtype (the model dtype)")
        self.max_batch_size = max_batch_size
        self.max_num_kv_splits = max_num_kv_splits
        self.num_sms = (torch.cuda.get_device_properties(self.device).multi_processor_count
                        if self.device.type == "cuda" else DEFAULT_NUM_SMS)
        self._meta: ForwardMeta | None = None
        # forward_rope's fused kernel (kernels.rope_store_kv); RADIXRT_ROPE_STORE=0 keeps the rotary
        # and K/V-store kernels apart (the same values; a switch for comparing the two on a GPU)
        env = Env.read()
        self.fuse_rope_store = env.rope_store
        self._interpreting = env.triton_interpret  # Triton kernels on CPU tensors (the tests)
        self._num_kv_splits = 1
        self._num_prefix_splits = 1
        self._num_q_heads: int | None = None
        self._mid_o: torch.Tensor | None = None  # flat fp32 workspace for decode partial outputs
        self._mid_lse: torch.Tensor | None = None
        if num_q_heads is not None:
            self._alloc_workspace(num_q_heads)
            if self.device.type == "cuda":
                self.warmup_cascade(num_q_heads)
                self.warmup_extend(num_q_heads)

    def warmup_cascade(self, num_q_heads: int) -> None:
        """Compile the cascade kernels now rather than in the first pass that groups requests
        (a compile takes seconds). Reads page 0 (the sink) of layer 0 and writes only scratch."""
        dev, dtype, ps = self.device, self.q_dtype, self.page_size
        q = torch.zeros(2, num_q_heads, self.head_dim, dtype=dtype, device=dev)
        i32 = {"dtype": torch.int32, "device": dev}
        for suffix_splits in (2, 1):  # three launches, and the fused form (see prepare)
            cascade_decode_attention(
                q, self.kv_pool.k_buffers[0], self.kv_pool.v_buffers[0], torch.zeros(2, 2, **i32),
                torch.full((2,), ps + 1, **i32), torch.full((2,), ps, **i32), torch.arange(2, **i32),
                torch.tensor([0, 2], **i32), torch.tensor([ps], **i32), ps, None, suffix_splits, 2, 2)

    def warmup_extend(self, num_q_heads: int) -> None:
        """Compile both extend-attention configs now (extend_attention._pick_config: 64-row blocks for
        short prompts over short prefixes, 128-row for the rest) rather than in the first prefill
        that needs one: a compile stalls that pass for seconds (seen on an H200 as a 2.7 s TTFT p50
        on the first shared-prefix requests after a start). q, k and v are views of one QKV row, as
        the model passes them, so their strides specialise alike. Reads page 0 (the sink) of layer 0
        and writes only scratch."""
        dev, dtype, ps = self.device, self.q_dtype, self.page_size
        hkv, d = self.num_kv_heads, self.head_dim
        qkv = torch.zeros(2, (num_q_heads + 2 * hkv) * d, dtype=dtype, device=dev)
        q, k, v = qkv.split([num_q_heads * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.view(2, num_q_heads, d), k.view(2, hkv, d), v.view(2, hkv, d)
        i32 = {"dtype": torch.int32, "device": dev}
        meta = (torch.zeros(1, 1, **i32), torch.ones(1, **i32), torch.full((1,), 2, **i32),
                torch.zeros(1, **i32))
        for max_seq_len in (ps, None):  # short -> 64-row blocks; unknown/long -> 128-row blocks
            extend_attention(q, k, v, self.kv_pool.k_buffers[0], self.kv_pool.v_buffers[0], *meta, ps, None,
                             2, max_seq_len=max_seq_len)
        # the warp-specialized Gluon kernel, where extend_attention routes passes of >= 1,024 new
        # tokens (Hopper, a bf16/fp16 pool): 1,024 new tokens over a one-token prefix in page 0
        n = 1024
        qkv = torch.zeros(n, (num_q_heads + 2 * hkv) * d, dtype=dtype, device=dev)
        q, k, v = qkv.split([num_q_heads * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.view(n, num_q_heads, d), k.view(n, hkv, d), v.view(n, hkv, d)
        meta = (torch.zeros(1, 1, **i32), torch.ones(1, **i32), torch.full((1,), n, **i32),
                torch.zeros(1, **i32))
        extend_attention(q, k, v, self.kv_pool.k_buffers[0], self.kv_pool.v_buffers[0], *meta, ps, None, n,
                         max_seq_len=n + 1, min_extend_len=n)

    @property
    def _kv_fp8(self) -> bool:
        return self.kv_pool.k_buffers[0].dtype == torch.float8_e4m3fn

    def _splits(self, batch_size: int, max_seq_len: int) -> int:
        return choose_num_kv_splits(batch_size, self.num_kv_heads, max_seq_len, self.num_sms,
                                    self.max_num_kv_splits, head_dim=self.head_dim, kv_fp8=self._kv_fp8)

    def decode_graph_key(self, batch_size: int, max_seq_len: int) -> tuple[int, str]:
        """The split count a plain DECODE pass of this shape takes, and the launch variant its split
        stage takes ("", "many" or "long": kernels' decode_launch_variant; see AttentionBackend)."""
        splits = self._splits(batch_size, max_seq_len)
        return splits, decode_launch_variant(batch_size, self.num_kv_heads, self.head_dim, splits,
                                             max_seq_len, self._kv_fp8, self.device)

    def _alloc_workspace(self, num_q_heads: int) -> None:
        """Room for batch * splits rows at every batch size <= max_batch_size and any sequence length."""
        rows = max(b * self._splits(b, 1 << 30) for b in range(1, self.max_batch_size + 1))
        self._num_q_heads = num_q_heads
        self._mid_o = torch.empty(rows * num_q_heads * self.head_dim, dtype=torch.float32, device=self.device)
        self._mid_lse = torch.empty(rows * num_q_heads, dtype=torch.float32, device=self.device)

    def prepare(self, meta: ForwardMeta) -> None:
        """Remember the pass's metadata and pick the decode split count (host ints only, no sync)."""
        self._meta = meta
        if meta.mode == ForwardMode.DECODE:
            c = meta.cascade
            if c is None:
                self._num_kv_splits = self._splits(meta.batch_size, meta.max_seq_len)
            else:  # suffix splits over the longest [kv_start, seq_len) range, prefix splits per group
                # sized for one group (the common case, and what a graph padded with empty
                # groups mostly runs); more groups only add parallelism
                fused = c.max_suffix_len <= self.cascade_fused_max_suffix
                self._num_prefix_splits = choose_num_prefix_splits(
                    1, c.max_group_size, c.num_q_heads, self.num_kv_heads, c.max_prefix_len, self.num_sms,
                    max_splits=CASCADE_FUSED_MAX_PREFIX_SPLITS if fused else 16,
                    block_m=default_tile(self.head_dim, self.device).block_m)
                if fused:
                    self._num_kv_splits = 1  # short suffixes: one program each, merging the prefix too
                else:  # at most 16 + 16 split slots: one compiled merge variant (see warmup_cascade);
                    # at least 2, since one split is the fused form, which this pass should not take
                    self._num_kv_splits = max(2, min(16, self._splits(meta.batch_size, c.max_suffix_len)))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                scale: float) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> o [T, Hq, D]; writes k/v into layer `layer_id` of the pool."""
        meta, k_buffer, v_buffer, kv_scales = self._layer(layer_id)
        store_kv(k_buffer, v_buffer, meta.out_cache_loc, k, v, **kv_scales)
        return self._attend(q, k, v, k_buffer, v_buffer, meta, scale, kv_scales)

    def forward_rope(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor, layer_id: int, scale: float) -> torch.Tensor:
        """AttentionBackend.forward_rope with the rotation and the K/V store in one kernel
        (kernels.rope_store_kv: q and k rotated in place, k and v written to the pool's slots), then
        attention as `forward`; tensors the kernel cannot take (CPU tensors outside Triton's
        interpreter) and a backend built with RADIXRT_ROPE_STORE=0 go the unfused way."""
        if not self.fuse_rope_store or not (q.is_cuda or self._interpreting):
            return super().forward_rope(q, k, v, positions, cos_sin_cache, layer_id, scale)
        meta, k_buffer, v_buffer, kv_scales = self._layer(layer_id)
        rope_store_kv(q, k, v, positions, cos_sin_cache, k_buffer, v_buffer, meta.out_cache_loc, **kv_scales)
        return self._attend(q, k, v, k_buffer, v_buffer, meta, scale, kv_scales)

    def _layer(self, layer_id: int):
        """(this pass's meta, layer `layer_id`'s K / V buffers, its {"k_scale", "v_scale"})."""
        meta = self._meta
        if meta is None:
            raise RuntimeError("TritonAttnBackend.forward called before prepare")
        kv_scales = {"k_scale": self.kv_pool_scale(layer_id, "k"),
                     "v_scale": self.kv_pool_scale(layer_id, "v")}
        return meta, self.kv_pool.k_buffers[layer_id], self.kv_pool.v_buffers[layer_id], kv_scales

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor,
                v_buffer: torch.Tensor, meta: ForwardMeta, scale: float,
                kv_scales: dict[str, float]) -> torch.Tensor:
        """Attention of a pass whose new K / V are already in the pool (forward's second half)."""
        if meta.mode == ForwardMode.DECODE:
            return self._decode(q, k_buffer, v_buffer, meta, scale, kv_scales)
        if meta.mode in (ForwardMode.EXTEND, ForwardMode.MIXED):
            return extend_attention(q, k, v, k_buffer, v_buffer, meta.page_table, meta.prefix_lens,
                                    meta.extend_lens, meta.extend_start_loc, meta.page_size, scale,
                                    meta.max_extend_len, max_seq_len=meta.max_seq_len,
                                    min_extend_len=meta.min_extend_len, **kv_scales)
        return torch.empty_like(q)  # IDLE: nothing to attend

    def kv_pool_scale(self, layer_id: int, which: str) -> float:
        """The pool's current FP8 scale of layer `layer_id`'s K ("k") or V ("v"); 1.0 without one."""
        scales = getattr(self.kv_pool, f"{which}_scales", None)
        return 1.0 if scales is None else float(scales[layer_id])

    def _decode(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, meta: ForwardMeta,
                scale: float, kv_scales: dict[str, float]) -> torch.Tensor:
        batch_size, num_q_heads, head_dim = q.shape
        splits = self._num_kv_splits
        c = meta.cascade
        if c is not None:
            return cascade_decode_attention(
                q, k_buffer, v_buffer, meta.page_table, meta.seq_lens, c.kv_start, c.members, c.starts,
                c.prefix_lens, meta.page_size, scale, splits, self._num_prefix_splits, c.max_group_size,
                **kv_scales)
        if self._num_q_heads != num_q_heads:
            self._alloc_workspace(num_q_heads)
        mid_o = mid_lse = None
        rows = batch_size * splits
        if rows * num_q_heads <= self._mid_lse.numel():
            mid_o = self._mid_o[: rows * num_q_heads * head_dim].view(batch_size, num_q_heads, splits,
                                                                      head_dim)
            mid_lse = self._mid_lse[: rows * num_q_heads].view(batch_size, num_q_heads, splits)
        return decode_attention(q, k_buffer, v_buffer, meta.page_table, meta.seq_lens, meta.page_size,
                                scale, splits, mid_o=mid_o, mid_lse=mid_lse, max_seq_len=meta.max_seq_len,
                                **kv_scales)
