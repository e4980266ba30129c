"""Build a Scheduler (and its KV manager) from the server arguments and the worker's Ready info."""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

from radixrt.config import ServerArgs
from radixrt.memory.kv_manager import KVManager
from radixrt.scheduler.cascade import DEFAULT_MIN_SAVED_TOKENS
from radixrt.scheduler.chunking import DEFAULT_ATTENTION_CONTEXT, attention_context
from radixrt.scheduler.scheduler import Scheduler

log = logging.getLogger("radixrt.scheduler")


def build_scheduler(args: ServerArgs, worker_info: dict[str, Any],
                    model_dir: Path | None = None) -> Scheduler:
    """A Scheduler sized from the worker's Ready info (pool pages, rows, context, vocab, EOS).

    Cascade grouping is on only with the triton attention backend (the one that runs it) and
    unless --disable-cascade-attention. model_dir: where the tokenizer for grammar-constrained
    decoding is read (see grammar_compiler_for); None: constrained requests are refused. Its
    config.json also gives adaptive chunking its cost model (attention_context_of).
    Raises KeyError when worker_info lacks a field.
    """
    compiler = None
    if model_dir is not None:
        compiler = grammar_compiler_for(model_dir, int(worker_info["vocab_size"]),
                                        tuple(int(t) for t in worker_info["eos_token_ids"]))
    kv = KVManager.create(int(worker_info["num_pages"]), args.page_size, args.disable_radix_cache,
                          num_host_pages=int(worker_info.get("num_host_pages", 0)),
                          write_policy=args.hicache_write_policy)
    return Scheduler(
        kv, page_size=args.page_size,
        max_running_requests=min(args.max_running_requests, int(worker_info["max_req_rows"])),
        chunk_size=args.resolved_chunked_prefill_size(), context_len=int(worker_info["context_length"]),
        vocab_size=int(worker_info["vocab_size"]), eos_token_ids=list(worker_info["eos_token_ids"]),
        schedule_policy=args.schedule_policy, max_queued_requests=args.max_queued_requests,
        random_seed=args.random_seed, max_prefill_tokens=args.max_prefill_tokens,
        cascade_min_saved_tokens=0 if (args.disable_cascade_attention
                                       or worker_info.get("attention_backend") != "triton")
        else DEFAULT_MIN_SAVED_TOKENS, grammar_compiler=compiler,
        adaptive_chunk=args.adaptive_chunked_prefill(), attn_context=attention_context_of(model_dir))


def attention_context_of(model_dir: Path | None) -> int:
    """chunking.attention_context of the model whose config.json is in model_dir (Hugging Face
    field names); DEFAULT_ATTENTION_CONTEXT when model_dir is None or the file lacks a size."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text()) if model_dir is not None else {}
        cfg = cfg.get("text_config", cfg)
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        return attention_context(hidden, int(cfg["intermediate_size"]), heads * head_dim, kv_heads * head_dim)
    except (OSError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return DEFAULT_ATTENTION_CONTEXT


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@functools.lru_cache(maxsize=4)
def load_grammar_tokenizer(model_dir: Path) -> Any:
    """The Hugging Face tokenizer of `model_dir` that grammar compilation reads its vocabulary from,
    loaded once per process.

    Raises:
        OSError, ValueError: the directory has no loadable tokenizer.
    """
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@functools.lru_cache(maxsize=4)
def grammar_compiler_for(model_dir: Path, vocab_size: int, eos_token_ids: tuple[int, ...]) -> Any:
    """The GrammarCompilerService for a model directory's tokenizer (vocab_size = the LM head's
    width, stop tokens = the EOS ids), or None when the directory has no tokenizer files (a
    dummy-weights model; logged). One per process and key, so Engines over the same model share it
    and its cache.

    Deferred: the xgrammar TokenizerInfo is built by the first constrained request's compile, on a
    compile thread (loading the tokenizer with the transformers import and the TokenizerInfo took
    ~4.5 s of CPU on a 2-core VM, 2026-12-02, a third of the scheduler's start-up); a tokenizer that
    then fails to load fails that and every later constrained request with the reason.
    """
    from radixrt.constrained import GrammarCompilerService, build_tokenizer_info
    from radixrt.gc_policy import freeze_startup_heap

    if not any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES):
        log.warning("no grammar support for %s (no tokenizer files): constrained requests will be refused",
                    model_dir)
        return None

    def load_info() -> Any:
        info = build_tokenizer_info(load_grammar_tokenizer(model_dir), vocab_size=vocab_size,
                                    stop_token_ids=list(eos_token_ids))
        freeze_startup_heap()  # the tokenizer and transformers join the frozen start-up heap (gc_policy)
        return info

    return GrammarCompilerService(load_info=load_info, vocab_size=vocab_size, stop_token_ids=eos_token_ids)
