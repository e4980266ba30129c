"""ModelRunner: owns the model, the KV pool and the device page table; executes ForwardBatches.

The scheduler decides everything (pages, slots, page-table edits, copy-on-write); the runner
applies those edits to its device copy `req_to_page [max_running_requests, max_pages_per_req]`,
runs the model over the flat batch, and samples one token per request from the hidden state of
that request's last new token, after penalties and logit bias (worker/penalties.py; outside any
CUDA graph, on a copy of the logits).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from radixrt import protocol
from radixrt.config import ServerArgs
from radixrt.models.loader import load_model, read_model_config
from radixrt.protocol import ForwardMode
from radixrt.worker import sampler
from radixrt.worker.forward_meta import ForwardMeta
from radixrt.worker.kv_pool import MIN_SLACK_BYTES, PagedKVPool, cuda_pool_tokens, measure_peak_bytes
from radixrt.worker.penalties import PenaltyState

if TYPE_CHECKING:
    from radixrt.worker.cuda_graph import CudaGraphRunner

CPU_DEFAULT_POOL_TOKENS = 65536
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_dtype(args: ServerArgs, device: str) -> torch.dtype:
    """--dtype, with auto = bf16 on cuda and fp32 on cpu."""
    if args.dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return _DTYPES[args.dtype]


def make_backend(name: str, pool: PagedKVPool, num_q_heads: int, max_batch_size: int) -> Any:
    """Attention backend by name ("torch" or "triton").

    max_batch_size: largest decode batch the triton backend preallocates workspace for (graph-safe).

    Raises:
        RuntimeError: the triton backend module is not available.
    """
    if name == "torch":
        from radixrt.worker.attention_torch import TorchAttnBackend

        return TorchAttnBackend(pool)
    if name == "triton":
        try:
            from radixrt.worker.attention_triton import TritonAttnBackend
        except ImportError as e:
            raise RuntimeError(f"attention backend 'triton' unavailable ({e}); "
                               "use --attention-backend torch") from None
        return TritonAttnBackend(pool, num_q_heads=num_q_heads, max_batch_size=max_batch_size)
    raise RuntimeError(f"unknown attention backend {name!r}")


class ModelRunner:
    """Executes ForwardBatches on one device.

    Args:
        args: server arguments (device, dtype, page size, pool size, ...).
        model_dir: a checked HF model directory (see loader.resolve_model_dir).

    Raises:
        ModelLoadError: the model cannot be loaded. RuntimeError: no memory for a KV pool.
    """

    def __init__(self, args: ServerArgs, model_dir: Path) -> None:
        self.args = args
        self.device = torch.device(args.resolved_device())
        self.dtype = resolve_dtype(args, self.device.type)
        self.page_size = args.page_size
        self.backend_name = args.resolved_attention_backend()
        cfg = read_model_config(Path(model_dir))
        self.context_len = args.context_length or cfg.max_position_embeddings
        self.model, self.config = load_model(Path(model_dir), self.dtype, self.device, args.load_format,
                                             seed=args.random_seed, max_positions=self.context_len)
        self.max_pages_per_req = math.ceil(self.context_len / self.page_size) + 1
        self.max_req_rows = args.max_running_requests
        self.req_to_page = torch.zeros((self.max_req_rows, self.max_pages_per_req), dtype=torch.int32,
                                       device=self.device)
        self.graphs: CudaGraphRunner | None = None
        self.last_next_ids: torch.Tensor | None = None  # [B] int64: tokens sampled by the last pass
        # before the pool, so that CUDA pool sizing counts it: rows x vocab x 5 bytes
        self.penalties = PenaltyState(self.max_req_rows, self.config.vocab_size, self.device)
        self.pool = PagedKVPool(self._num_pages(), self.page_size, cfg.num_layers, cfg.num_kv_heads,
                                cfg.head_dim, self.dtype, self.device)
        self.backend = self._make_backend(self.pool)
        if self._use_cuda_graphs():
            from radixrt.worker.cuda_graph import CudaGraphRunner

            self.graphs = CudaGraphRunner(self, self._graph_max_bs())

    def _make_backend(self, pool: PagedKVPool) -> Any:
        return make_backend(self.backend_name, pool, self.config.num_heads,
                            max(self.args.max_running_requests, self.args.cuda_graph_max_bs))

    def _use_cuda_graphs(self) -> bool:
        """Graphs need CUDA and a backend without host syncs in forward (triton)."""
        return (self.device.type == "cuda" and not self.args.disable_cuda_graph
                and self.backend_name == "triton" and self._graph_max_bs() >= 1)

    def _graph_max_bs(self) -> int:
        return min(self.args.cuda_graph_max_bs, self.args.max_running_requests)

    def _num_pages(self) -> int:
        """Pool size in pages (+1 for the reserved page 0)."""
        a, c = self.args, self.config
        if a.max_total_tokens is not None:
            tokens = a.max_total_tokens
        elif self.device.type == "cuda":
            kv_bytes = PagedKVPool.bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim, self.dtype)
            tokens = cuda_pool_tokens(self.device, a.mem_fraction_static, kv_bytes,
                                      self._activation_reserve_bytes(), self.page_size)
        else:
            tokens = CPU_DEFAULT_POOL_TOKENS
        return math.ceil(tokens / self.page_size) + 1

    # ------------------------------------------------------------------ per pass
    def _tensor(self, a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.array(a, copy=True)).to(self.device, dtype, non_blocking=True)

    def apply_memory_ops(self, batch: protocol.ForwardBatch) -> None:
        """Page-table writes then copy-on-write page copies, as the scheduler ordered."""
        if len(batch.upd_rows):
            rows = self._tensor(batch.upd_rows, torch.int64)
            cols = self._tensor(batch.upd_cols, torch.int64)
            self.req_to_page[rows, cols] = self._tensor(batch.upd_pages, torch.int32)
        if len(batch.cow_src):
            self.pool.copy_pages(self._tensor(batch.cow_src, torch.int64),
                                 self._tensor(batch.cow_dst, torch.int64))

    def build_meta(self, batch: protocol.ForwardBatch) -> ForwardMeta:
        """Device ForwardMeta for a batch (after apply_memory_ops)."""
        ext = batch.extend_lens.astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(ext)[:-1]]) if len(ext) else ext
        seq = batch.seq_lens.astype(np.int64)
        rows = self._tensor(batch.req_rows, torch.int64)
        return ForwardMeta(
            mode=ForwardMode(batch.mode), page_size=self.page_size,
            page_table=self.req_to_page[rows],
            seq_lens=self._tensor(seq, torch.int32), extend_lens=self._tensor(ext, torch.int32),
            prefix_lens=self._tensor(seq - ext, torch.int32),
            extend_start_loc=self._tensor(starts, torch.int32),
            out_cache_loc=self._tensor(batch.out_cache_loc, torch.int64),
            positions=self._tensor(batch.positions, torch.int64),
            max_seq_len=int(seq.max()) if len(seq) else 0,
            max_extend_len=int(ext.max()) if len(ext) else 0,
        )

    def sampling_tensors(self, batch: protocol.ForwardBatch) -> sampler.SamplingTensors:
        return sampler.SamplingTensors(
            temperature=self._tensor(batch.temperature, torch.float32),
            top_p=self._tensor(batch.top_p, torch.float32),
            top_k=self._tensor(batch.top_k, torch.int64),
            min_p=self._tensor(batch.min_p, torch.float32),
            seeds=self._tensor(batch.seeds, torch.int64),
            sample_steps=self._tensor(batch.sample_steps, torch.int64),
        )

    def input_ids_of(self, batch: protocol.ForwardBatch) -> torch.Tensor:
        """input_ids [T] int64 on device, placeholders `-(j + 1)` replaced by the token sampled for
        request j of the previous pass (overlap scheduling sends a pass before its inputs are known)."""
        ids = self._tensor(batch.input_ids, torch.int64)
        if len(batch.input_ids) and int(batch.input_ids.min()) < 0:
            if self.last_next_ids is None:
                raise ValueError(f"ForwardBatch {batch.batch_id}: placeholder input with no previous pass")
            prev = self.last_next_ids[(-ids - 1).clamp(0, len(self.last_next_ids) - 1)]
            ids = torch.where(ids < 0, prev, ids)
        return ids

    @torch.inference_mode()
    def forward_logits(self, batch: protocol.ForwardBatch) -> torch.Tensor:
        """Apply memory ops, run the model, return logits [B, V] float32 of each request's last token."""
        self.apply_memory_ops(batch)
        meta = self.build_meta(batch)
        input_ids = self.input_ids_of(batch)
        if self.graphs is not None and self.graphs.can_run(meta):
            return self.graphs.replay(meta, input_ids)
        self.backend.prepare(meta)
        hidden = self.model(input_ids, meta.positions, meta, self.backend)  # [T, H]
        last = (meta.extend_start_loc + meta.extend_lens - 1).long()  # [B]
        return self.model.compute_logits(hidden[last])

    @torch.inference_mode()
    def forward(self, batch: protocol.ForwardBatch) -> protocol.ForwardResult:
        """Execute one ForwardBatch and sample; see protocol.ForwardBatch for the fields."""
        t0 = time.perf_counter()
        if batch.mode == ForwardMode.IDLE or len(batch.req_rows) == 0:
            self.apply_memory_ops(batch)
            return protocol.ForwardResult(batch_id=batch.batch_id)
        if int(batch.extend_lens.min()) < 1 or int(batch.extend_lens.sum()) != len(batch.input_ids):
            raise ValueError(f"ForwardBatch {batch.batch_id}: every request needs extend_len >= 1 and "
                             f"sum(extend_lens) == len(input_ids); got {batch.extend_lens.tolist()} "
                             f"for {len(batch.input_ids)} tokens")
        self.penalties.prepare(batch)
        logits = self.forward_logits(batch)
        # penalties and logit bias shape what is sampled; logprobs stay those of the raw logits
        next_ids = sampler.sample(self.penalties.process(logits, batch), self.sampling_tensors(batch))
        self.penalties.record(batch, next_ids)
        self.last_next_ids = next_ids
        res = protocol.ForwardResult(batch_id=batch.batch_id)
        if batch.return_logprob:
            chosen, top_ids, top_vals = sampler.logprobs_of(logits, next_ids, batch.top_logprobs_num)
            res.logprobs = chosen.cpu().numpy().astype(np.float32)
            res.top_logprob_ids = top_ids.reshape(-1).cpu().numpy().astype(np.int32)
            res.top_logprobs = top_vals.reshape(-1).cpu().numpy().astype(np.float32)
        res.next_token_ids = next_ids.cpu().numpy().astype(np.int32)
        res.forward_ms = (time.perf_counter() - t0) * 1000.0
        return res

    # ------------------------------------------------------------------ CUDA memory profile
    def _activation_reserve_bytes(self) -> int:
        """Memory to keep free for forward passes, measured by one worst-case pass.

        The pass: EXTEND of the largest token count one batch may carry (--chunked-prefill-size
        plus a decode token per running request) into a temporary pool, with logprobs, then
        top-p sampling over --max-running-requests rows. The reserve is that peak (twice when
        CUDA graphs keep their own memory pool), the graphs' static logits buffer, and slack.
        """
        a = self.args
        chunk = a.resolved_chunked_prefill_size()
        tokens = chunk if chunk > 0 else max(a.max_prefill_tokens, self.context_len)
        batch, num_pages = self._profile_batch(tokens + a.max_running_requests)
        c = self.config
        tmp_pool = PagedKVPool(num_pages, self.page_size, c.num_layers, c.num_kv_heads, c.head_dim,
                               self.dtype, self.device)
        rows, dev = self.max_req_rows, self.device
        st = sampler.SamplingTensors(
            temperature=torch.ones(rows, device=dev), top_p=torch.full((rows,), 0.9, device=dev),
            top_k=torch.full((rows,), -1, dtype=torch.int64, device=dev), min_p=torch.zeros(rows, device=dev),
            seeds=torch.arange(rows, device=dev), sample_steps=torch.zeros(rows, dtype=torch.int64, device=dev))

        def run() -> None:
            self.pool, self.backend = tmp_pool, self._make_backend(tmp_pool)  # workspace counted too
            self.forward(batch)
            sampler.sample(torch.randn(rows, c.vocab_size, device=self.device), st)

        try:
            peak = measure_peak_bytes(run, self.device)
        finally:
            for name in ("pool", "backend"):  # the real ones are built after sizing
                self.__dict__.pop(name, None)
            self.req_to_page.zero_()
        graphs = self._use_cuda_graphs()
        logits_buf = self._graph_max_bs() * c.vocab_size * 4 if graphs else 0
        return peak * (2 if graphs else 1) + logits_buf + MIN_SLACK_BYTES

    def _profile_batch(self, total_tokens: int) -> tuple[protocol.ForwardBatch, int]:
        """An EXTEND batch of `total_tokens` tokens over as few requests as the context allows,
        with its pages numbered from 1; returns (batch, pages needed including page 0)."""
        ps, per_req = self.page_size, self.context_len - 1
        lens = [min(per_req, total_tokens - i) for i in range(0, total_tokens, per_req)][:self.max_req_rows]
        rows, cols, pages, locs, positions = [], [], [], [], []
        next_page = 1
        for r, n in enumerate(lens):
            own = np.arange(next_page, next_page + math.ceil(n / ps))
            next_page += len(own)
            rows.append(np.full(len(own), r))
            cols.append(np.arange(len(own)))
            pages.append(own)
            pos = np.arange(n)
            positions.append(pos)
            locs.append(own[pos // ps] * ps + pos % ps)
        b, i32 = len(lens), np.int32
        batch = protocol.ForwardBatch(
            batch_id=-1, mode=int(ForwardMode.EXTEND), req_rows=np.arange(b, dtype=i32),
            input_ids=np.zeros(sum(lens), i32), positions=np.concatenate(positions).astype(i32),
            out_cache_loc=np.concatenate(locs).astype(i32), seq_lens=np.array(lens, i32),
            extend_lens=np.array(lens, i32), upd_rows=np.concatenate(rows).astype(i32),
            upd_cols=np.concatenate(cols).astype(i32), upd_pages=np.concatenate(pages).astype(i32),
            temperature=np.ones(b, np.float32), top_p=np.full(b, 0.9, np.float32),
            top_k=np.full(b, -1, i32), min_p=np.zeros(b, np.float32), seeds=np.zeros(b, i32),
            sample_steps=np.zeros(b, i32), return_logprob=True, top_logprobs_num=5)
        return batch, next_page

    def info(self) -> dict[str, Any]:
        """Facts for the Ready message (scheduler and tokenizer size themselves from these)."""
        pool = self.pool
        return {
            "num_pages": pool.num_pages,
            "page_size": self.page_size,
            "max_req_rows": self.max_req_rows,
            "max_pages_per_req": self.max_pages_per_req,
            # a request must fit in the pool on its own, or it could never be admitted
            "context_length": min(self.context_len, pool.usable_tokens),
            "vocab_size": self.config.vocab_size,
            "eos_token_ids": list(self.config.eos_token_ids),
            "kv_bytes_per_token": pool.kv_bytes_per_token,
            "pool_tokens": pool.usable_tokens,
            "pool_gib": round(pool.total_bytes / (1 << 30), 3),
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "model_type": self.config.model_type,
            "attention_backend": self.args.resolved_attention_backend(),
            "cuda_graph": self.graphs is not None,
        }
