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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from radixrt import protocol
from radixrt.config import ServerArgs
from radixrt.models.loader import load_model, read_model_config
from radixrt.protocol import ForwardMode
from radixrt.worker import sampler
from radixrt.worker.forward_meta import CascadeMeta, ForwardMeta
from radixrt.worker.kv_pool import MIN_SLACK_BYTES, PagedKVPool, cuda_pool_tokens, measure_peak_bytes
from radixrt.worker.penalties import PenaltyState

if TYPE_CHECKING:
    from radixrt.worker.cuda_graph import CudaGraphRunner

CPU_DEFAULT_POOL_TOKENS = 65536


def cascade_kv_start(batch: protocol.ForwardBatch) -> np.ndarray:
    """[B] int32 (or [0] without cascade): each grouped request's shared prefix length, else 0."""
    if len(batch.cascade_starts) < 2:
        return np.zeros(0, np.int32)
    sizes = np.diff(batch.cascade_starts)
    kv_start = np.zeros(len(batch.req_rows), np.int32)
    kv_start[batch.cascade_members] = np.repeat(batch.cascade_prefix_lens, sizes)
    return kv_start


class TimedSpan:
    """When a pass ran on the device: CUDA events around its work (wall clock on CPU, where the
    work is done by the time `launch` returns)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.begin = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.t_begin = self.t_end = time.perf_counter()

    @classmethod
    def start(cls, device: torch.device) -> TimedSpan:
        return cls(device)

    def stop(self) -> None:
        if self.cuda:
            self.end.record()
        else:
            self.t_end = time.perf_counter()

    def done(self) -> bool:
        return self.end.query() if self.cuda else True

    def wait(self) -> None:
        if self.cuda:
            self.end.synchronize()

    def busy_ms(self) -> float:
        """Device time of the pass (ms); valid after wait()."""
        return self.begin.elapsed_time(self.end) if self.cuda else (self.t_end - self.t_begin) * 1e3

    def gap_ms(self, prev: TimedSpan | None) -> float:
        """Device idle time (ms) between the end of `prev` and the start of this pass; -1 if none."""
        if prev is None:
            return -1.0
        if self.cuda:
            return max(0.0, prev.end.elapsed_time(self.begin))
        return max(0.0, (self.t_begin - prev.t_end) * 1e3)


@dataclass(slots=True)
class PendingPass:
    """A launched pass: its results are being copied to `host` (pinned) behind the device work."""

    batch_id: int
    t0: float
    timing: TimedSpan
    host: list[torch.Tensor] = field(default_factory=list)
    path: str = "idle"  # how it ran (ModelRunner.last_path)
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
        self._last_timing: TimedSpan | None = None  # device timing of the last finished pass
        self.last_path = "eager"  # how the last pass ran: eager, graph, cascade-eager, cascade-graph
        # before the pool, so that CUDA pool sizing counts it: rows x vocab x 5 bytes
        self.penalties = PenaltyState(self.max_req_rows, self.config.vocab_size, self.device)
        self.pool = PagedKVPool(self._num_pages(), self.page_size, cfg.num_layers, cfg.num_kv_heads,
                                cfg.head_dim, self.dtype, self.device)
        self.backend = self._make_backend(self.pool)
        if self._use_cuda_graphs():
            from radixrt.worker.cuda_graph import CudaGraphRunner

            self.graphs = CudaGraphRunner(self, self._graph_max_bs(),
                                          cascade=not args.disable_cascade_attention)

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
    def _upload(self, parts: list[np.ndarray], np_dtype: type) -> list[torch.Tensor]:
        """Host arrays -> device tensors in ONE host-to-device copy (pinned, asynchronous on CUDA).

        A pass needs ~20 small arrays; copying them one by one costs ~10 us of host time each.
        Pinned blocks come from torch's caching host allocator, which does not reuse a block until
        its copy has finished, so a pass may be launched while the previous one still runs.
        """
        sizes = [len(a) for a in parts]
        host = torch.from_numpy(np.concatenate(parts).astype(np_dtype, copy=False))
        if self.device.type == "cuda":
            host = host.pin_memory().to(self.device, non_blocking=True)
        return list(torch.split(host, sizes))  # np.concatenate made a fresh array: nothing aliases the batch

    def stage(self, batch: protocol.ForwardBatch) -> tuple[ForwardMeta, torch.Tensor, sampler.SamplingTensors]:
        """Upload the pass's arrays, apply its page-table writes and copy-on-writes, and return
        (ForwardMeta, input_ids [T] int64 with placeholders resolved, SamplingTensors).

        Three host-to-device copies in all (int64, int32, float32 groups); no device sync.
        """
        ext = batch.extend_lens.astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(ext)[:-1]]) if len(ext) else ext
        seq = batch.seq_lens.astype(np.int64)
        rows_np, use_min_p, need_sort = sampler.host_plan(batch.temperature, batch.top_k, batch.top_p,
                                                          batch.min_p, self.config.vocab_size)
        (req_rows, out_cache_loc, positions, ids, top_k, seeds, steps, upd_rows, upd_cols, cow_src, cow_dst,
         sampled_rows, cascade_members) = self._upload(
            [batch.req_rows, batch.out_cache_loc, batch.positions, batch.input_ids, batch.top_k, batch.seeds,
             batch.sample_steps, batch.upd_rows, batch.upd_cols, batch.cow_src, batch.cow_dst, rows_np,
             batch.cascade_members], np.int64)
        kv_start = cascade_kv_start(batch)
        (seq_lens, extend_lens, prefix_lens, extend_start_loc, upd_pages, cascade_starts,
         cascade_prefix_lens, kv_start_dev) = self._upload(
            [seq, ext, seq - ext, starts, batch.upd_pages, batch.cascade_starts, batch.cascade_prefix_lens,
             kv_start], np.int32)
        temperature, top_p, min_p = self._upload([batch.temperature, batch.top_p, batch.min_p],
                                                 np.float32)
        # memory ops, in the scheduler's order: page-table writes, then copy-on-write page copies
        if len(batch.upd_rows):
            self.req_to_page[upd_rows, upd_cols] = upd_pages
        if len(batch.cow_src):
            self.pool.copy_pages(cow_src, cow_dst)
        cascade = None
        if len(batch.cascade_starts) > 1:
            cascade = CascadeMeta(members=cascade_members, starts=cascade_starts,
                                  prefix_lens=cascade_prefix_lens, kv_start=kv_start_dev,
                                  max_group_size=int(np.diff(batch.cascade_starts).max()),
                                  max_prefix_len=int(batch.cascade_prefix_lens.max()),
                                  max_suffix_len=int((seq - kv_start).max()),
                                  num_q_heads=self.config.num_heads)
        meta = ForwardMeta(
            mode=ForwardMode(batch.mode), page_size=self.page_size, page_table=self.req_to_page[req_rows],
            seq_lens=seq_lens, extend_lens=extend_lens, prefix_lens=prefix_lens,
            extend_start_loc=extend_start_loc, out_cache_loc=out_cache_loc, positions=positions,
            max_seq_len=int(seq.max()) if len(seq) else 0, max_extend_len=int(ext.max()) if len(ext) else 0,
            cascade=cascade)
        st = sampler.SamplingTensors(
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seeds=seeds, sample_steps=steps,
            plan=sampler.SamplingPlan(sampled_rows, len(rows_np), use_min_p, need_sort))
        return meta, self._resolve_placeholders(batch, ids), st

    def _resolve_placeholders(self, batch: protocol.ForwardBatch, ids: torch.Tensor) -> torch.Tensor:
        """Inputs not known when the pass was sent (overlap scheduling) are tokens the previous pass
        sampled: ids[prev_token_pos[k]] = last_next_ids[prev_token_src[k]], one gather on the device
        (one small upload, no sync). ids: [T] int64 on the device; returns a new tensor when K > 0."""
        if not len(batch.prev_token_pos):
            return ids
        if self.last_next_ids is None:
            raise ValueError(f"ForwardBatch {batch.batch_id}: in-flight input with no previous pass")
        pos, src = self._upload([batch.prev_token_pos, batch.prev_token_src], np.int64)
        return ids.index_put((pos,), self.last_next_ids[src].to(ids.dtype))

    @torch.inference_mode()
    def forward_logits(self, batch: protocol.ForwardBatch) -> torch.Tensor:
        """Apply memory ops, run the model, return logits [B, V] float32 of each request's last token."""
        meta, input_ids, _ = self.stage(batch)
        return self._logits(meta, input_ids)

    def _logits(self, meta: ForwardMeta, input_ids: torch.Tensor) -> torch.Tensor:
        if self.graphs is not None and self.graphs.can_run(meta):
            self.last_path = "cascade-graph" if meta.cascade is not None else "graph"
            return self.graphs.replay(meta, input_ids)
        self.last_path = "cascade-eager" if meta.cascade is not None else "eager"
        self.backend.prepare(meta)
        hidden = self.model(input_ids, meta.positions, meta, self.backend)  # [T, H]
        last = (meta.extend_start_loc + meta.extend_lens - 1).long()  # [B]
        return self.model.compute_logits(hidden[last])

    @torch.inference_mode()
    def launch(self, batch: protocol.ForwardBatch) -> PendingPass:
        """Enqueue one ForwardBatch (memory ops, model, sampling, device->host copies of the results)
        without waiting for the device; `finish` waits and returns the ForwardResult.

        On CUDA the host returns as soon as the work is queued, so the next pass can be launched
        behind this one and the GPU never waits for Python between them (overlap scheduling).
        Passes must be finished in launch order. See protocol.ForwardBatch for the fields.

        Raises:
            ValueError: a malformed batch (extend_lens not matching input_ids, placeholders with no
                previous pass).
        """
        t0 = time.perf_counter()
        timing = TimedSpan.start(self.device)
        pending = PendingPass(batch_id=batch.batch_id, t0=t0, timing=timing)
        if batch.mode == ForwardMode.IDLE or len(batch.req_rows) == 0:
            self.stage(batch)
            timing.stop()
            return pending
        if int(batch.extend_lens.min()) < 1 or int(batch.extend_lens.sum()) != len(batch.input_ids):
            raise ValueError(f"ForwardBatch {batch.batch_id}: every request needs extend_len >= 1 and "
                             f"sum(extend_lens) == len(input_ids); got {batch.extend_lens.tolist()} "
                             f"for {len(batch.input_ids)} tokens")
        self.penalties.prepare(batch)
        meta, input_ids, st = self.stage(batch)
        logits = self._logits(meta, input_ids)
        # penalties and logit bias shape what is sampled; logprobs stay those of the raw logits
        next_ids = sampler.sample(self.penalties.process(logits, batch), st)
        self.penalties.record(batch, next_ids)
        self.last_next_ids = next_ids
        outs = [next_ids.to(torch.int32)]
        if batch.return_logprob:
            chosen, top_ids, top_vals = sampler.logprobs_of(logits, next_ids, batch.top_logprobs_num)
            outs += [chosen, top_ids.reshape(-1).to(torch.int32), top_vals.reshape(-1)]
        pending.host = [self._to_host(t) for t in outs]
        pending.path = self.last_path
        timing.stop()
        return pending

    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return t
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return host.copy_(t, non_blocking=True)

    def finish(self, pending: PendingPass) -> protocol.ForwardResult:
        """Wait for a launched pass and return its ForwardResult (with GPU busy/idle times)."""
        pending.timing.wait()
        res = protocol.ForwardResult(batch_id=pending.batch_id)
        if pending.host:
            res.next_token_ids = pending.host[0].numpy()
            if len(pending.host) > 1:
                res.logprobs = pending.host[1].numpy().astype(np.float32)
                res.top_logprob_ids = pending.host[2].numpy()
                res.top_logprobs = pending.host[3].numpy().astype(np.float32)
        res.forward_ms = (time.perf_counter() - pending.t0) * 1000.0
        res.gpu_busy_ms = pending.timing.busy_ms()
        res.gpu_gap_ms = pending.timing.gap_ms(self._last_timing)
        self._last_timing = pending.timing
        return res

    def poll(self, pending: PendingPass) -> bool:
        """True when `finish(pending)` would not block."""
        return pending.timing.done()

    def forward(self, batch: protocol.ForwardBatch) -> protocol.ForwardResult:
        """Execute one ForwardBatch and sample (launch + finish); see protocol.ForwardBatch."""
        return self.finish(self.launch(batch))

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
