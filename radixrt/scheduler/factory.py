"""Build a Scheduler (and its KV manager) from the server arguments and the worker's Ready info."""

from __future__ import annotations

from typing import Any

from radixrt.config import ServerArgs
from radixrt.memory.kv_manager import KVManager
from radixrt.scheduler.cascade import DEFAULT_MIN_SAVED_TOKENS
from radixrt.scheduler.scheduler import Scheduler


def build_scheduler(args: ServerArgs, worker_info: dict[str, Any]) -> Scheduler:
    """A Scheduler sized from the worker's Ready info (pool pages, rows, context, vocab, EOS).

    Cascade grouping is on only with the triton attention backend (the one that runs it) and
    unless --disable-cascade-attention. Raises KeyError when worker_info lacks a field.
    """
    kv = KVManager.create(int(worker_info["num_pages"]), args.page_size, args.disable_radix_cache)
    return Scheduler(
        kv, page_size=args.page_size,
        max_running_requests=min(args.max_running_requests, int(worker_info["max_req_rows"])),
        chunk_size=args.resolved_chunked_prefill_size(), context_len=int(worker_info["context_length"]),
        vocab_size=int(worker_info["vocab_size"]), eos_token_ids=list(worker_info["eos_token_ids"]),
        schedule_policy=args.schedule_policy, max_queued_requests=args.max_queued_requests,
        random_seed=args.random_seed, max_prefill_tokens=args.max_prefill_tokens,
        cascade_min_saved_tokens=0 if (args.disable_cascade_attention
                                       or worker_info.get("attention_backend") != "triton")
        else DEFAULT_MIN_SAVED_TOKENS)
