"""ModelRunner: owns the model, the KV pool and the device page table; executes ForwardBatches.

The scheduler decides everything (pages, slots, page-table edits, copy-on-write); the runner
applies those edits to its device copy `req_to_page [max_running_requests, max_pages_per_req]`,
runs the model over the flat batch, and samples one token per request from the hidden state of
that request's last new token, after penalties and logit bias (worker/penalties.py; outside any
CUDA graph, on a copy of the logits).

The runner composes the worker's pieces: factories.py (dtype, backend, graph settings),
memory_profile.py (pool size), device_batch.py (the batch on the device), forward_pass.py (the
steps of a pass), cuda_graph.py (decode replays) and device_timing.py (busy / idle times). What it
keeps itself is the state between passes: the tokens the last pass sampled (for placeholders), how
the last pass ran, and the device span of the last finished pass.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from radixrt import protocol
from radixrt.attention.base import ForwardMeta
from radixrt.config import Env, ServerArgs
from radixrt.models.loader import load_model, read_model_config
from radixrt.models.resolve import ModelLoadError
from radixrt.protocol import ForwardMode
from radixrt.worker import sampler
from radixrt.worker.device_batch import DeviceBatch
from radixrt.worker.device_timing import TimedSpan
from radixrt.worker.factories import (
    backend_for,
    graph_max_bs,
    resolve_dtype,
    resolve_kv_dtype,
    use_cuda_graphs,
)
from radixrt.worker.forward_pass import PassOutputs, eager_logits, sample_outputs, stage_batch
from radixrt.worker.host_pool import HostCopyEngine, HostKVPool
from radixrt.worker.kv_pool import PagedKVPool
from radixrt.worker.memory_profile import activation_reserve_bytes, num_pool_pages
from radixrt.worker.penalties import PenaltyState

log = logging.getLogger("radixrt.worker")

if TYPE_CHECKING:
    from radixrt.parallel.group import TPGroup
    from radixrt.worker.cuda_graph import CudaGraphRunner


@dataclass(slots=True)
class PendingPass:
    """A launched pass: its outputs are being copied to pinned host memory behind the device work."""

    batch_id: int
    t0: float  # time.perf_counter() at launch
    timing: TimedSpan
    outputs: PassOutputs | None = None  # None for an IDLE or empty pass
    path: str = "idle"  # how it ran (ModelRunner.last_path)
    # deferred grammar rows: (batch, logits [B, V], sampling tensors) until `supply_mask` samples
    unsampled: tuple[protocol.ForwardBatch, torch.Tensor, sampler.SamplingTensors] | None = None
    stall: TimedSpan | None = None  # from the forward's end to the mask's arrival (device idle)


class ModelRunner:
    """Executes ForwardBatches on one device.

    Args:
        args: server arguments (device, dtype, page size, pool size, ...).
        model_dir: a checked HF model directory (see loader.resolve_model_dir).
        tp: this worker's tensor-parallel rank (--tp-size > 1), else None. The runner then holds
            the rank's slice of the model and a pool of its KV heads; every rank runs every pass
            and samples the same tokens from the same all-gathered logits (docs/tensor_parallel.md).

    Raises:
        ModelLoadError: the model cannot be loaded. RuntimeError: no memory for a KV pool.
    """

    def __init__(self, args: ServerArgs, model_dir: Path, tp: TPGroup | None = None) -> None:
        self.args = args
        self.tp = tp
        self.device = torch.device(args.resolved_device())
        self.dtype = resolve_dtype(args, self.device.type)
        self.kv_dtype = resolve_kv_dtype(args, self.dtype)
        self.page_size = args.page_size
        self.backend_name = args.resolved_attention_backend()
        self.context_len = args.context_length or read_model_config(Path(model_dir)).max_position_embeddings
        self.model, self.config = load_model(Path(model_dir), self.dtype, self.device, args.load_format,
                                             seed=args.random_seed, max_positions=self.context_len,
                                             quantization=args.quantization, tp=tp,
                                             lm_head_quantization=args.lm_head_quantization)
        self.max_pages_per_req = math.ceil(self.context_len / self.page_size) + 1
        self.max_req_rows = args.max_running_requests
        self.req_to_page = torch.zeros((self.max_req_rows, self.max_pages_per_req), dtype=torch.int32,
                                       device=self.device)
        self.graphs: CudaGraphRunner | None = None
        self.last_next_ids: torch.Tensor | None = None  # [B] int64: tokens sampled by the last pass
        self._last_timing: TimedSpan | None = None  # device timing of the last finished pass
        self.last_path = "eager"  # how the last pass ran: eager, graph, cascade-eager, cascade-graph
        self._awaiting_mask: PendingPass | None = None  # launched with deferred grammar rows, unsampled
        # before the pool, so that CUDA pool sizing counts it: rows x vocab x 5 bytes
        self.penalties = PenaltyState(self.max_req_rows, self.config.vocab_size, self.device)
        c = self.config
        num_pages = num_pool_pages(args, c, self.device, self.kv_dtype, self._activation_reserve_bytes)
        if tp is not None:  # one page table for all ranks: the pool the tightest rank can hold
            num_pages = tp.min_int(num_pages)
        self.pool = PagedKVPool(num_pages, self.page_size, c.num_layers, c.num_kv_heads, c.head_dim,
                                self.kv_dtype, self.device)
        if self.kv_dtype == torch.float8_e4m3fn:  # the checkpoint's per-layer scales, else 1.0
            try:
                self.pool.set_kv_scales(getattr(self.model, "kv_cache_scales", {}))
            except ValueError as e:
                raise ModelLoadError(f"{model_dir}: {e} (the checkpoint's KV-cache scales, which "
                                     "--kv-cache-dtype fp8_e4m3 uses)") from None
        if self.served_context_len < 2:  # no request could ever run: refuse to start (one line, exit 2)
            raise ModelLoadError(
                f"the KV pool holds {self.pool.usable_tokens} usable tokens in pages of {self.page_size} "
                "(one page is kept for copy-on-write): too small for any request; lower --page-size or "
                "raise --max-total-tokens")
        if self.served_context_len < self.context_len:  # said once, where an operator looks
            log.warning("context length %d (the model's or --context-length) capped at %d: the KV pool "
                        "holds %d tokens, less one page kept for a copy-on-write page",
                        self.context_len, self.served_context_len, self.pool.usable_tokens)
        self.backend = backend_for(args, self.pool, c.num_heads)
        self._prefault = self.device.type == "cpu" and Env.read().kv_prefault
        self._prefault_s = 0.0  # idle time spent in prefault_step
        self.copier: HostCopyEngine | None = None  # the host KV tier (--enable-hierarchical-cache)
        if args.enable_hierarchical_cache:
            num_host = HostKVPool.num_pages_for(self.pool, args.hicache_size, args.hicache_ratio)
            host = HostKVPool(num_host, self.page_size, c.num_layers, c.num_kv_heads, c.head_dim,
                              self.kv_dtype, pin=self.device.type == "cuda")
            self.copier = HostCopyEngine(self.pool, host)
        if use_cuda_graphs(args, self.device):
            from radixrt.worker.cuda_graph import CudaGraphRunner

            self.graphs = CudaGraphRunner(
                self.model, self.backend, device=self.device, page_size=self.page_size,
                context_len=self.context_len, max_pages_per_req=self.max_pages_per_req,
                max_bs=graph_max_bs(args), cascade=not args.disable_cascade_attention, dtype=self.dtype)

    def prefault_step(self) -> bool:
        """While the worker is idle: write into the next slice of the CPU KV pool's untouched memory
        pages (PagedKVPool.prefault_step); False once done, on CUDA, or with RADIXRT_KV_PREFAULT=0."""
        if not self._prefault:
            return False
        t0 = time.perf_counter()
        self._prefault = self.pool.prefault_step()
        self._prefault_s += time.perf_counter() - t0
        if not self._prefault:
            log.info("KV pool's memory pages written once: %.1f GB in %.1f s of idle time",
                     self.pool.num_slots * self.pool.bytes_per_token(
                         self.config.num_layers, self.config.num_kv_heads, self.config.head_dim,
                         self.kv_dtype) / 1e9, self._prefault_s)
        return self._prefault

    def _activation_reserve_bytes(self) -> int:
        """CUDA memory to leave free for passes (memory_profile.activation_reserve_bytes)."""
        return activation_reserve_bytes(self.args, self.model, self.config, self.dtype, self.context_len,
                                        self.req_to_page, self.penalties)

    # ------------------------------------------------------------------ per pass
    def stage(self, batch: protocol.ForwardBatch
              ) -> tuple[ForwardMeta, torch.Tensor, sampler.SamplingTensors]:
        """Upload the pass's arrays, apply its page-table writes and copy-on-writes, and return
        (ForwardMeta, input_ids [T] int64 with placeholders resolved, SamplingTensors).

        Three host-to-device copies in all (int64, int32, float32 groups); no device sync.
        """
        meta, db = stage_batch(batch, self.req_to_page, self.pool, self.config)
        return meta, self._resolve_placeholders(batch, db), db.sampling_tensors()

    def _resolve_placeholders(self, batch: protocol.ForwardBatch, db: DeviceBatch) -> torch.Tensor:
        """Inputs not known when the pass was sent (overlap scheduling) are tokens the previous pass
        sampled: ids[prev_token_pos[k]] = last_next_ids[prev_token_src[k]], one gather on the device
        (the indices ride in the pass's int64 upload; no sync). Returns input_ids [T] int64 on the
        device, a new tensor when K > 0.

        Raises:
            ValueError: in-flight inputs in the first pass (nothing sampled them).
        """
        ids = db.input_ids
        if not len(batch.prev_token_pos):
            return ids
        if self.last_next_ids is None:
            raise ValueError(f"ForwardBatch {batch.batch_id}: in-flight input with no previous pass")
        return ids.index_put((db.prev_token_pos,), self.last_next_ids[db.prev_token_src].to(ids.dtype))

    @torch.inference_mode()
    def forward_logits(self, batch: protocol.ForwardBatch) -> torch.Tensor:
        """Apply memory ops, run the model, return logits [B, V] float32 of each request's last token."""
        meta, input_ids, _ = self.stage(batch)
        return self._logits(meta, input_ids).float()

    def _logits(self, meta: ForwardMeta, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] from a CUDA graph when one fits the pass (the model's dtype, a view of the
        graphs' static buffer), else eagerly (float32)."""
        if self.graphs is not None and self.graphs.can_run(meta):
            self.last_path = "cascade-graph" if meta.cascade is not None else "graph"
            return self.graphs.replay(meta, input_ids)
        self.last_path = "cascade-eager" if meta.cascade is not None else "eager"
        return eager_logits(self.model, self.backend, meta, input_ids)

    @torch.inference_mode()
    def launch(self, batch: protocol.ForwardBatch) -> PendingPass:
        """Enqueue one ForwardBatch (memory ops, model, sampling, device->host copies of the results)
        without waiting for the device; `finish` waits and returns the ForwardResult.

        On CUDA the host returns as soon as the work is queued, so the next pass can be launched
        behind this one and the GPU never waits for Python between them (overlap scheduling).
        Passes must be finished in launch order. See protocol.ForwardBatch for the fields.

        A batch with deferred grammar rows (ForwardBatch.grammar_deferred) runs the model only; the
        pass samples when `supply_mask` brings its GrammarMask, which must happen before the next
        launch (its in-flight inputs are this pass's tokens) and before `finish`.

        Raises:
            ValueError: a malformed batch (extend_lens not matching input_ids, placeholders with no
                previous pass), or the previous pass still awaits its GrammarMask.
        """
        if self._awaiting_mask is not None:
            raise ValueError(f"ForwardBatch {batch.batch_id}: pass {self._awaiting_mask.batch_id} "
                             "still awaits its GrammarMask")
        t0 = time.perf_counter()
        timing = TimedSpan.start(self.device)
        pending = PendingPass(batch_id=batch.batch_id, t0=t0, timing=timing)
        if self.copier is not None:
            self.copier.before_pass(batch)  # host-tier loads and eviction stores
        if batch.mode == ForwardMode.IDLE or len(batch.req_rows) == 0:
            self.stage(batch)
            if self.copier is not None:
                self.copier.after_pass(batch)
            timing.stop()
            return pending
        if int(batch.extend_lens.min()) < 1 or int(batch.extend_lens.sum()) != len(batch.input_ids):
            raise ValueError(f"ForwardBatch {batch.batch_id}: every request needs extend_len >= 1 and "
                             f"sum(extend_lens) == len(input_ids); got {batch.extend_lens.tolist()} "
                             f"for {len(batch.input_ids)} tokens")
        meta, input_ids, st = self.stage(batch)
        logits = self._logits(meta, input_ids)
        pending.path = self.last_path
        if self.copier is not None:
            self.copier.after_pass(batch)  # write-through stores of the KV this pass wrote
        if len(batch.grammar_deferred):  # sampling waits for the GrammarMask (supply_mask)
            pending.unsampled = (batch, logits, st)
            pending.stall = TimedSpan.start(self.device)
            self._awaiting_mask = pending
            return pending
        self._sample(pending, batch, logits, st, None)
        return pending

    @torch.inference_mode()
    def supply_mask(self, pending: PendingPass, mask: protocol.GrammarMask) -> None:
        """The deferred grammar rows of a pass launched without them: sample it now (queued on the
        device; no wait). Must come before the next pass's launch, which reads this pass's tokens.

        Raises:
            ValueError: the pass has no deferred rows left, or the mask is for other rows.
        """
        if pending.unsampled is None:
            raise ValueError(f"GrammarMask for pass {mask.batch_id}: no pass awaits a mask")
        batch, logits, st = pending.unsampled
        pending.unsampled, self._awaiting_mask = None, None
        pending.stall.stop()
        self._sample(pending, batch, logits, st, mask)

    def _sample(self, pending: PendingPass, batch: protocol.ForwardBatch, logits: torch.Tensor,
                st: sampler.SamplingTensors, mask: protocol.GrammarMask | None) -> None:
        # penalties and logit bias shape what is sampled; logprobs stay those of the raw logits
        self.last_next_ids, outputs = sample_outputs(batch, logits, st, self.penalties, mask)
        pending.outputs = outputs.to_host()
        pending.timing.stop()

    def finish(self, pending: PendingPass) -> protocol.ForwardResult:
        """Wait for a launched pass and return its ForwardResult (with GPU busy/idle times)."""
        if pending.unsampled is not None:
            raise ValueError(f"pass {pending.batch_id} finished before its GrammarMask arrived")
        pending.timing.wait()
        res = protocol.ForwardResult(batch_id=pending.batch_id)
        if pending.outputs is not None:
            pending.outputs.fill(res)
        res.forward_ms = (time.perf_counter() - pending.t0) * 1000.0
        # waiting for a deferred grammar mask idles the device inside the pass: count it as a gap
        stall_ms = pending.stall.busy_ms() if pending.stall is not None else 0.0
        res.gpu_busy_ms = pending.timing.busy_ms() - stall_ms
        gap_ms = pending.timing.gap_ms(self._last_timing)
        res.gpu_gap_ms = gap_ms + stall_ms if gap_ms >= 0 else gap_ms
        self._last_timing = pending.timing
        if self.copier is not None:  # an IDLE pass waits for the copies: nothing else runs
            self.copier.collect(res, wait=pending.outputs is None)
        return res

    def poll(self, pending: PendingPass) -> bool:
        """True when `finish(pending)` would not block (a pass awaiting its mask never is)."""
        return pending.unsampled is None and pending.timing.done()

    def forward(self, batch: protocol.ForwardBatch) -> protocol.ForwardResult:
        """Execute one ForwardBatch and sample (launch + finish); see protocol.ForwardBatch."""
        return self.finish(self.launch(batch))

    @property
    def served_context_len(self) -> int:
        """The context length requests get: the model's (or --context-length), capped so that a request
        fits in the pool on its own, or it could never be admitted, with one page to spare: a request
        that shares a cached prefix ending inside a page copies that page (copy on write) while the
        tree keeps the original, locked on its path (docs/memory.md, "Copy-on-write")."""
        return min(self.context_len, self.pool.usable_tokens - self.page_size)

    def info(self) -> dict[str, Any]:
        """Facts for the Ready message (scheduler and tokenizer size themselves from these)."""
        pool = self.pool
        return {
            "num_pages": pool.num_pages,
            "page_size": self.page_size,
            "max_req_rows": self.max_req_rows,
            "max_pages_per_req": self.max_pages_per_req,
            "context_length": self.served_context_len,
            "vocab_size": self.config.vocab_size,
            "eos_token_ids": list(self.config.eos_token_ids),
            "kv_bytes_per_token": pool.kv_bytes_per_token,
            "pool_tokens": pool.usable_tokens,
            "pool_gib": round(pool.total_bytes / (1 << 30), 3),
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "kv_cache_dtype": str(self.kv_dtype).removeprefix("torch."),
            "quantization": getattr(self.model, "quantization", None),
            "model_type": self.config.model_type,
            "attention_backend": self.backend_name,
            "cuda_graph": self.graphs is not None,
            "num_host_pages": 0 if self.copier is None else self.copier.host.num_pages,
            "tp_size": 1 if self.tp is None else self.tp.size,
        }
