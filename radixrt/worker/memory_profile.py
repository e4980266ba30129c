"""How many KV pages fit: the CUDA memory budget and the activation reserve measured by one pass.

Called once at start-up, after the weights, the device page table and the penalty state are
allocated and before the real KV pool exists. On CUDA the pool gets what --mem-fraction-static
leaves after everything already in use, minus a reserve for the forward passes; the reserve is
measured by running the worst-case pass (`profile_pass`) over a throwaway pool and backend of the
real kind. The runner's own pool and backend are never touched (they do not exist yet); the device
page table rows the pass writes are zeroed afterwards. On CPU, or with --max-total-tokens, the pool
size is a fixed number of tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from radixrt import protocol
from radixrt.attention.base import AttentionBackend
from radixrt.config import ServerArgs
from radixrt.models.model_config import ModelConfig
from radixrt.protocol import ForwardMode
from radixrt.worker import sampler
from radixrt.worker.factories import backend_for, graph_max_bs, use_cuda_graphs
from radixrt.worker.forward_pass import eager_logits, sample_outputs, stage_batch
from radixrt.worker.kv_pool import PagedKVPool
from radixrt.worker.penalties import PenaltyState

CPU_DEFAULT_POOL_TOKENS = 65536
GIB = 1 << 30
MIN_SLACK_BYTES = 512 << 20  # allocator fragmentation, cuBLAS/Triton workspaces, NCCL later


def num_pool_pages(args: ServerArgs, config: ModelConfig, device: torch.device, dtype: torch.dtype,
                   activation_reserve: Callable[[], int]) -> int:
    """Pool size in pages (+1 for the reserved page 0): --max-total-tokens if given, else what fits
    on a CUDA device (`activation_reserve()` is called only then), else CPU_DEFAULT_POOL_TOKENS."""
    if args.max_total_tokens is not None:
        tokens = args.max_total_tokens
    elif device.type == "cuda":
        kv_bytes = PagedKVPool.bytes_per_token(config.num_layers, config.num_kv_heads, config.head_dim, dtype)
        tokens = cuda_pool_tokens(device, args.mem_fraction_static, kv_bytes, activation_reserve(),
                                  args.page_size)
    else:
        tokens = CPU_DEFAULT_POOL_TOKENS
    return math.ceil(tokens / args.page_size) + 1


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


def activation_reserve_bytes(args: ServerArgs, model: nn.Module, config: ModelConfig, dtype: torch.dtype,
                             context_len: int, req_to_page: torch.Tensor, penalties: PenaltyState) -> int:
    """Memory to keep free for forward passes on CUDA, measured by one worst-case pass.

    The pass: EXTEND of the largest token count one batch may carry (--chunked-prefill-size
    plus a decode token per running request) into a throwaway pool, with logprobs, then top-p
    sampling over --max-running-requests rows (`profile_pass`). The reserve is that peak (twice
    when CUDA graphs keep their own memory pool), the graphs' static logits buffer, and slack.
    The throwaway pool is allocated before the measurement and its backend inside it (so the
    backend's workspace counts); both are released after it. req_to_page is zeroed afterwards.
    """
    device, rows = req_to_page.device, int(req_to_page.shape[0])
    chunk = args.resolved_chunked_prefill_size()
    tokens = chunk if chunk > 0 else max(args.max_prefill_tokens, context_len)
    batch, num_pages = profile_batch(tokens + args.max_running_requests, args.page_size, context_len, rows)
    pool = PagedKVPool(num_pages, args.page_size, config.num_layers, config.num_kv_heads, config.head_dim,
                       dtype, device)
    st = top_p_sampling(rows, device)
    backends: list[AttentionBackend] = []  # kept until the measurement is over, as the pool is
    try:
        peak = measure_peak_bytes(lambda: backends.append(
            profile_pass(args, batch, st, model, config, pool, req_to_page, penalties)), device)
    finally:
        req_to_page.zero_()
    graphs = use_cuda_graphs(args, device)
    # the graphs' static logits (the model's dtype; 4 bytes per entry bounds bf16 / fp16 / fp32)
    logits_buf = graph_max_bs(args) * config.vocab_size * 4 if graphs else 0
    return peak * (2 if graphs else 1) + logits_buf + MIN_SLACK_BYTES


def profile_pass(args: ServerArgs, batch: protocol.ForwardBatch, st: sampler.SamplingTensors,
                 model: nn.Module, config: ModelConfig, pool: PagedKVPool, req_to_page: torch.Tensor,
                 penalties: PenaltyState) -> AttentionBackend:
    """Run `batch` eagerly over `pool` with a fresh --attention-backend (stage, logits, sampling,
    logprobs: the steps of a real pass), then sample over logits of st's rows with `st`.

    Writes `batch`'s page-table rows into req_to_page and K/V into `pool`; returns the backend.
    """
    backend = backend_for(args, pool, config.num_heads)
    with torch.inference_mode():  # as ModelRunner.launch
        meta, db = stage_batch(batch, req_to_page, pool, config)
        logits = eager_logits(model, backend, meta, db.input_ids)
        sample_outputs(batch, logits, db.sampling_tensors(), penalties)
    rows = int(st.temperature.shape[0])
    sampler.sample(torch.randn(rows, config.vocab_size, device=req_to_page.device), st)
    return backend


def top_p_sampling(rows: int, device: torch.device) -> sampler.SamplingTensors:
    """SamplingTensors for `rows` rows at temperature 1, top-p 0.9: the sampler's costliest path
    (sort), decided on the device (no plan)."""
    i64 = {"dtype": torch.int64, "device": device}
    return sampler.SamplingTensors(
        temperature=torch.ones(rows, device=device), top_p=torch.full((rows,), 0.9, device=device),
        top_k=torch.full((rows,), -1, **i64), min_p=torch.zeros(rows, device=device),
        seeds=torch.arange(rows, device=device), sample_steps=torch.zeros(rows, **i64))


def profile_batch(total_tokens: int, page_size: int, context_len: int,
                  max_rows: int) -> tuple[protocol.ForwardBatch, int]:
    """An EXTEND batch of `total_tokens` tokens over as few requests as the context allows (at most
    `max_rows`), with its pages numbered from 1; returns (batch, pages needed including page 0)."""
    per_req = context_len - 1
    lens = [min(per_req, total_tokens - i) for i in range(0, total_tokens, per_req)][:max_rows]
    rows, cols, pages, locs, positions = [], [], [], [], []
    next_page = 1
    for r, n in enumerate(lens):
        own = np.arange(next_page, next_page + math.ceil(n / page_size))
        next_page += len(own)
        rows.append(np.full(len(own), r))
        cols.append(np.arange(len(own)))
        pages.append(own)
        pos = np.arange(n)
        positions.append(pos)
        locs.append(own[pos // page_size] * page_size + pos % page_size)
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
