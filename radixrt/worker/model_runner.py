"""ModelRunner: owns the model, the KV pool and the device page table; executes ForwardBatches.

The scheduler decides everything (pages, slots, page-table edits, copy-on-write); the runner
applies those edits to its device copy `req_to_page [max_running_requests, max_pages_per_req]`,
runs the model over the flat batch, and samples one token per request from the hidden state of
that request's last new token.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixrt import protocol
from radixrt.config import ServerArgs
from radixrt.models.loader import load_model, read_model_config
from radixrt.protocol import ForwardMode
from radixrt.worker import sampler
from radixrt.worker.forward_meta import ForwardMeta
from radixrt.worker.kv_pool import PagedKVPool

CPU_DEFAULT_POOL_TOKENS = 65536
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_dtype(args: ServerArgs, device: str) -> torch.dtype:
    """--dtype, with auto = bf16 on cuda and fp32 on cpu."""
    if args.dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return _DTYPES[args.dtype]


def make_backend(name: str, pool: PagedKVPool) -> Any:
    """Attention backend by name ("torch" or "triton").

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
        return TritonAttnBackend(pool)
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
        cfg = read_model_config(Path(model_dir))
        self.context_len = args.context_length or cfg.max_position_embeddings
        self.model, self.config = load_model(Path(model_dir), self.dtype, self.device, args.load_format,
                                             seed=args.random_seed, max_positions=self.context_len)
        self.max_pages_per_req = math.ceil(self.context_len / self.page_size) + 1
        self.max_req_rows = args.max_running_requests
        self.req_to_page = torch.zeros((self.max_req_rows, self.max_pages_per_req), dtype=torch.int32,
                                       device=self.device)
        self.pool = PagedKVPool(self._num_pages(), self.page_size, cfg.num_layers, cfg.num_kv_heads,
                                cfg.head_dim, self.dtype, self.device)
        self.backend = make_backend(args.resolved_attention_backend(), self.pool)
        self.graphs = None  # set by enable_cuda_graphs on CUDA

    def _num_pages(self) -> int:
        """Pool size in pages (+1 for the reserved page 0)."""
        if self.args.max_total_tokens is not None:
            tokens = self.args.max_total_tokens
        elif self.device.type == "cuda":
            from radixrt.worker.cuda_graph import profile_pool_tokens

            tokens = profile_pool_tokens(self)
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

    @torch.inference_mode()
    def forward_logits(self, batch: protocol.ForwardBatch) -> torch.Tensor:
        """Apply memory ops, run the model, return logits [B, V] float32 of each request's last token."""
        self.apply_memory_ops(batch)
        meta = self.build_meta(batch)
        if self.graphs is not None and self.graphs.can_run(meta):
            return self.graphs.replay(meta, self._tensor(batch.input_ids, torch.int64))
        self.backend.prepare(meta)
        hidden = self.model(self._tensor(batch.input_ids, torch.int64), meta.positions, meta,
                            self.backend)  # [T, H]
        last = (meta.extend_start_loc + meta.extend_lens - 1).long()  # [B]
        return self.model.compute_logits(hidden[last])

    @torch.inference_mode()
    def forward(self, batch: protocol.ForwardBatch) -> protocol.ForwardResult:
        """Execute one ForwardBatch and sample; see protocol.ForwardBatch for the fields."""
        t0 = time.perf_counter()
        if batch.mode == ForwardMode.IDLE or len(batch.req_rows) == 0:
            self.apply_memory_ops(batch)
            return protocol.ForwardResult(batch_id=batch.batch_id)
        logits = self.forward_logits(batch)
        next_ids = sampler.sample(logits, self.sampling_tensors(batch))
        res = protocol.ForwardResult(batch_id=batch.batch_id)
        if batch.return_logprob:
            chosen, top_ids, top_vals = sampler.logprobs_of(logits, next_ids, batch.top_logprobs_num)
            res.logprobs = chosen.cpu().numpy().astype(np.float32)
            res.top_logprob_ids = top_ids.reshape(-1).cpu().numpy().astype(np.int32)
            res.top_logprobs = top_vals.reshape(-1).cpu().numpy().astype(np.float32)
        res.next_token_ids = next_ids.cpu().numpy().astype(np.int32)
        res.forward_ms = (time.perf_counter() - t0) * 1000.0
        return res

    def info(self) -> dict[str, Any]:
        """Facts for the Ready message (scheduler and tokenizer size themselves from these)."""
        pool = self.pool
        return {
            "num_pages": pool.num_pages,
            "page_size": self.page_size,
            "max_req_rows": self.max_req_rows,
            "max_pages_per_req": self.max_pages_per_req,
            "context_length": self.context_len,
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
