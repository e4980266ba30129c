"""Grammar compilation off the scheduler's thread, with a compile cache keyed by (kind, text).

Ownership: the scheduler process builds one `GrammarCompilerService` from the model's tokenizer at
start-up and is its only caller. The service may be deferred (`load_info`): the TokenizerInfo is then
built by the first compile, on a pool thread, as vLLM's structured-output manager initialises its
backend on the first structured request; a server that never sees one never pays for it.
`submit` never blocks: it returns a `GrammarHandle` at once (the cached one when the spec was seen
before) and the check + compile run on a thread pool (xgrammar releases the GIL while compiling, so
the scheduler loop keeps running; a deferred TokenizerInfo build holds it more). The scheduler polls
`handle.done()` each step and admits the request once it is done: `handle.result()` is then the
`xgrammar.CompiledGrammar`, shared by every request with the same spec, or raises the
GrammarError that the request should fail with.

Vocabulary: the TokenizerInfo covers `vocab_size` ids, the width of the model's LM head
(config.json's vocab_size), so that ids the tokenizer does not define are masked. Special tokens
other than the stop tokens are masked too: xgrammar would otherwise treat "<|im_start|>" and the
like as plain text that may appear inside a JSON string.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from radixrt.constrained.errors import GrammarError, xgrammar_message
from radixrt.constrained.spec import JSON_ANY_WHITESPACE, GrammarKind, GrammarSpec, validate_spec


def build_tokenizer_info(tokenizer: Any, *, vocab_size: int | None = None,
                         stop_token_ids: Sequence[int] | None = None) -> Any:
    """xgrammar TokenizerInfo for a Hugging Face tokenizer, built once per process (~0.5 s).

    vocab_size: width of the model's logits (config.json vocab_size); default: the tokenizer's.
    stop_token_ids: ids that end a completed grammar (the model's EOS ids); default: the tokenizer's
    eos_token_id. Added special tokens that are not stop tokens decode to "" so xgrammar never
    allows them. Raises ValueError when stop_token_ids is empty.
    """
    import xgrammar as xgr

    stops = list(stop_token_ids) if stop_token_ids is not None else None
    base = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stops)
    encoded = [""] * base.vocab_size
    for token, idx in tokenizer.get_vocab().items():
        if idx < base.vocab_size:
            encoded[idx] = token
    keep = set(base.stop_token_ids)
    for idx, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False) and idx < base.vocab_size and idx not in keep:
            encoded[idx] = ""
    return xgr.TokenizerInfo.from_vocab_and_metadata(encoded, base.dump_metadata())


class GrammarHandle:
    """One spec's compile, in flight or done. Poll `done()`; never blocks unless asked to wait."""

    __slots__ = ("spec", "_future")

    def __init__(self, spec: GrammarSpec, future: Future) -> None:
        self.spec = spec
        self._future = future

    def done(self) -> bool:
        """True once the compile has finished, successfully or not."""
        return self._future.done()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call fn() once the compile has finished: from the compile thread, or at once (in the
        caller's thread) when it already has. fn must be thread-safe and must not raise."""
        self._future.add_done_callback(lambda _fut: fn())

    def error(self) -> str | None:
        """The one-line GrammarError message if the compile failed; None while pending or on success."""
        if not self._future.done():
            return None
        exc = self._future.exception()
        return None if exc is None else str(exc)

    def result(self, timeout_s: float | None = 0.0) -> Any:
        """The xgrammar CompiledGrammar (the same object for every handle of this spec).

        timeout_s: how long to wait; 0 (default) does not wait, None waits for ever.
        Raises GrammarError when the compile failed, TimeoutError when not done within timeout_s.
        """
        try:
            return self._future.result(timeout=timeout_s)
        except futures.TimeoutError:  # a distinct class before Python 3.11
            raise TimeoutError(f"{self.spec.kind.value} grammar still compiling") from None


class GrammarCompilerService:
    """Compiles GrammarSpecs for one tokenizer on `num_threads` threads, caching up to
    `cache_entries` results (successes and failures; least recently submitted evicted first)."""

    def __init__(self, tokenizer_info: Any = None, *, load_info: Callable[[], Any] | None = None,
                 vocab_size: int | None = None, stop_token_ids: Sequence[int] = (),
                 num_threads: int = 2, cache_entries: int = 1024) -> None:
        """tokenizer_info: the xgrammar TokenizerInfo. Or, deferred: `load_info()` builds it on the
        first compile (on a pool thread), with `vocab_size` and `stop_token_ids` the ids it will have
        (the bitmask width is needed before then); when it raises, every compile fails with a
        GrammarError that names the cause.

        Raises:
            ValueError: neither or both of tokenizer_info and load_info; load_info without
                vocab_size; num_threads or cache_entries < 1.
        """
        if (tokenizer_info is None) == (load_info is None) or (load_info is not None and vocab_size is None):
            raise ValueError("give tokenizer_info, or load_info with vocab_size")
        if num_threads < 1 or cache_entries < 1:
            raise ValueError(f"num_threads and cache_entries must be >= 1, "
                             f"got {num_threads}, {cache_entries}")
        self.tokenizer_info = tokenizer_info  # None until a deferred service's first compile
        self._load_info = load_info
        self._load_error: str | None = None
        self._vocab_size = int(vocab_size if vocab_size is not None else tokenizer_info.vocab_size)
        self._stop_token_ids = (list(tokenizer_info.stop_token_ids) if tokenizer_info is not None
                                else list(stop_token_ids))
        self._num_threads = num_threads
        self._xgr: Any = None  # xgrammar's GrammarCompiler, built with the TokenizerInfo
        self._xgr_lock = threading.Lock()
        if tokenizer_info is not None:
            self._xgr = self._new_xgr(tokenizer_info)
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="grammar-compile")
        self._cache: OrderedDict[tuple[str, str], GrammarHandle] = OrderedDict()
        self._cache_entries = cache_entries
        self._lock = threading.Lock()
        self.num_hits = 0
        self.num_misses = 0

    def _new_xgr(self, tokenizer_info: Any) -> Any:
        import xgrammar as xgr

        # Our cache is the one that counts (it also returns the same object); xgrammar's is off.
        return xgr.GrammarCompiler(tokenizer_info, max_threads=self._num_threads, cache_enabled=False)

    def _compiler(self) -> Any:
        """xgrammar's GrammarCompiler; a deferred service builds it (and its TokenizerInfo) here, once.
        Runs on pool threads. Raises GrammarError when load_info failed."""
        with self._xgr_lock:
            if self._xgr is None and self._load_error is None:
                assert self._load_info is not None
                try:
                    info = self._load_info()
                    self._xgr = self._new_xgr(info)
                    self.tokenizer_info = info
                except Exception as e:  # noqa: BLE001 - any failure means no grammar support
                    self._load_error = f"no grammar support for this model: {type(e).__name__}: {e}"
            if self._xgr is None:
                raise GrammarError(str(self._load_error))
            return self._xgr

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, *, vocab_size: int | None = None,
                       stop_token_ids: Sequence[int] | None = None, num_threads: int = 2,
                       cache_entries: int = 1024) -> GrammarCompilerService:
        """Load the HF tokenizer of `model_dir` and build the service (see build_tokenizer_info)."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        info = build_tokenizer_info(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        return cls(info, num_threads=num_threads, cache_entries=cache_entries)

    @property
    def vocab_size(self) -> int:
        """Number of token ids the bitmask describes (columns of a bitmask row, before packing)."""
        return self._vocab_size

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self._stop_token_ids)

    def submit(self, spec: GrammarSpec) -> GrammarHandle:
        """Start compiling `spec` (or return the cached handle for its key). Never blocks."""
        with self._lock:
            handle = self._cache.get(spec.key)
            if handle is not None:
                self._cache.move_to_end(spec.key)
                self.num_hits += 1
                return handle
            self.num_misses += 1
            handle = GrammarHandle(spec, self._pool.submit(self._compile, spec))
            self._cache[spec.key] = handle
            self._evict()
            return handle

    def compile_now(self, spec: GrammarSpec) -> Any:
        """submit + wait: the CompiledGrammar, or GrammarError (for tests, benchmarks, warm-up)."""
        return self.submit(spec).result(timeout_s=None)

    def cache_info(self) -> dict[str, int]:
        """{"entries", "hits", "misses"} of the compile cache."""
        with self._lock:
            return {"entries": len(self._cache), "hits": self.num_hits, "misses": self.num_misses}

    def shutdown(self) -> None:
        """Stop the threads (pending compiles are cancelled)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _evict(self) -> None:
        """Drop the oldest finished entries beyond the limit (in-flight ones stay; requests poll them)."""
        excess = len(self._cache) - self._cache_entries
        for key in [k for k, h in self._cache.items() if h.done()][:max(excess, 0)]:
            del self._cache[key]

    def _compile(self, spec: GrammarSpec) -> Any:
        """Runs on a pool thread: check the spec, then compile it for this tokenizer."""
        text = validate_spec(spec)
        c = self._compiler()
        try:
            if spec.kind in (GrammarKind.JSON_SCHEMA, GrammarKind.JSON_OBJECT):
                return c.compile_json_schema(text, any_whitespace=JSON_ANY_WHITESPACE)
            if spec.kind is GrammarKind.REGEX:
                return c.compile_regex(text)
            if spec.kind is GrammarKind.EBNF:
                return c.compile_grammar(text)
            return c.compile_structural_tag(text)
        except (RuntimeError, ValueError, TypeError) as e:
            raise GrammarError(f"invalid {spec.kind.value}: {xgrammar_message(e)}") from None
