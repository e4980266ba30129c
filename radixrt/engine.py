"""`radixrt.Engine`: the offline, in-process engine (same scheduler, cache and worker; no HTTP).

    from radixrt import Engine
    eng = Engine(model_path=None, max_total_tokens=16384)        # default SmolLM2-135M-Instruct
    outs = eng.generate(["The capital of France is"], {"temperature": 0, "max_new_tokens": 8})
    outs[0]["text"], outs[0]["meta_info"]["cached_tokens"]

The scheduler process's pass loop (`radixrt.scheduler.pipeline.PassPipeline`: schedule -> build ->
`ModelRunner.launch` / `finish` -> process, with overlap scheduling) runs here in this process, so
batch jobs and offline throughput measurements skip the ZeroMQ hops. Benchmarks trace passes with
`engine.pipeline.add_pass_hook`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from radixrt.config import Env, ServerArgs
from radixrt.gc_policy import freeze_startup_heap
from radixrt.protocol import GenerateReq
from radixrt.scheduler.factory import build_scheduler
from radixrt.scheduler.pass_trace import maybe_trace
from radixrt.scheduler.pipeline import PassLauncher, PassPipeline
from radixrt.scheduler.scheduler import Scheduler

Prompt = str | Sequence[int]
START_TOKENS = 8192  # generate() starts the first pass once this many prompt tokens are queued
COMPILE_WAIT_S = 0.05  # with only grammar compiles pending, wait this long for one (instead of spinning)


class Engine:
    """Offline generation. Keyword arguments are ServerArgs fields (`model_path`, `page_size`, ...).

    Raises:
        radixrt.models.loader.ModelLoadError: the model cannot be found or read.
        ValueError: a bad ServerArgs value (message names it), tp_size > 1 (the Engine runs one
            worker in this process; tensor parallelism is the server's: docs/tensor_parallel.md);
            from generate, see there.
    """

    def __init__(self, **kwargs: Any) -> None:
        from transformers import AutoTokenizer

        from radixrt.models.loader import resolve_model_dir
        from radixrt.worker.model_runner import ModelRunner

        args = ServerArgs(**kwargs)
        if args.tp_size != 1:
            raise ValueError("Engine: tp_size must be 1 (tensor parallelism needs the server)")
        model_dir = resolve_model_dir(args.model_path, Env.read().cache_dir, args.load_format)
        runner = ModelRunner(args, model_dir)
        try:  # a dummy-weights directory may hold only config.json: token-id prompts then
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        except (OSError, ValueError):
            tokenizer = None
        self._setup(args, runner, runner.info(), tokenizer, model_dir)
        freeze_startup_heap()  # collections on the pass path skip the model and tokenizer objects

    @classmethod
    def from_runner(cls, args: ServerArgs, runner: PassLauncher, info: dict[str, Any],
                    tokenizer: Any = None, model_dir: Path = Path(".")) -> Engine:
        """An Engine over a given runner (anything with ModelRunner's launch / finish) and its
        Ready info, with no model loaded: host-side benchmarks and tests drive it with a fake."""
        eng = cls.__new__(cls)
        eng._setup(args, runner, info, tokenizer, model_dir)
        return eng

    def _setup(self, args: ServerArgs, runner: Any, info: dict[str, Any], tokenizer: Any,
               model_dir: Path) -> None:
        self.args, self.runner, self.info, self.tokenizer = args, runner, info, tokenizer
        self.model_dir = model_dir
        grammar_dir = model_dir if tokenizer is not None else None  # constrained decoding needs one
        self.pipeline = PassPipeline(build_scheduler(args, info, grammar_dir), runner,
                                     overlap=not args.disable_overlap_schedule)
        self.pass_trace = maybe_trace(self.pipeline, Env.read().pass_trace)  # RADIXRT_PASS_TRACE
        self._ids = itertools.count()

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler the pass pipeline drives. Assigning a fresh one (same worker, empty tree;
        benchmarks) is allowed only while no pass is in flight."""
        return self.pipeline.sched

    @scheduler.setter
    def scheduler(self, sched: Scheduler) -> None:
        if self.pipeline.in_flight is not None:
            raise RuntimeError("cannot replace the scheduler while a pass is in flight")
        self.pipeline.sched = sched

    @property
    def overlap(self) -> bool:
        """Overlap scheduling on (the default; disable_overlap_schedule=True turns it off)."""
        return self.pipeline.overlap

    @overlap.setter
    def overlap(self, on: bool) -> None:
        self.pipeline.overlap = on

    def _encode(self, prompt: Prompt) -> np.ndarray:
        """Token ids [T] int64 of a text or token-id prompt.

        Raises:
            ValueError: token ids that are not integers, or a text prompt without a tokenizer.
        """
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"{self.model_dir} has no tokenizer: pass token ids")
            return np.array(self.tokenizer.encode(prompt, add_special_tokens=False), np.int64)
        try:
            ids = np.asarray(prompt)
        except (ValueError, TypeError) as e:
            raise ValueError(f"a prompt must be a string or a sequence of token ids: {e}") from None
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError("a prompt must be a string or a flat sequence of integer token ids")
        if ids.dtype.kind == "u" and ids.size and int(ids.max()) > np.iinfo(np.int64).max:
            raise ValueError("token ids must be below 2**63")
        return ids.astype(np.int64, copy=False)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
                 ) -> list[dict[str, Any]]:
        """Generate for every prompt (text or token ids) and return, in order, dicts with
        `text`, `output_ids` and `meta_info` (prompt_tokens, completion_tokens, cached_tokens,
        finish_reason). Stop strings in `stop` end a request and are trimmed from `text`.

        A sampling dict may constrain its output with one of `regex`, `json_schema` (JSON text or
        a dict) or `ebnf` (SGLang's names; radixrt.constrained.spec_from_request).
        A request the scheduler refuses (an empty or too long prompt, token ids outside the
        vocabulary, a bad sampling value such as a negative temperature, an invalid grammar)
        comes back with finish_reason "abort" and meta_info["error"]; the others still run.

        Raises:
            ValueError: sampling_params is not one dict, or one dict per prompt (before anything
                is queued); a prompt is neither a string nor a flat sequence of integer token ids,
                or is text while the model has no tokenizer; a sampling dict sets two grammars.
                Prompts are converted as they are queued, so the requests of this call queued
                before the bad prompt are aborted first: nothing of the call stays queued or running.
        """
        if isinstance(prompts, np.ndarray):  # one prompt [T], or prompts [N, T]
            prompts = [prompts] if prompts.ndim == 1 else list(prompts)
        elif isinstance(prompts, str) or (len(prompts) and isinstance(prompts[0], int | np.integer)):
            prompts = [prompts]  # type: ignore[list-item]
        n = len(prompts)
        params = sampling_params if isinstance(sampling_params, Sequence) else [sampling_params or {}] * n
        if len(params) != n:
            raise ValueError("sampling_params: need one dict per prompt")
        # sampling errors before anything is queued (a pass may start while the rest are queued)
        try:
            params = [dict(sp) for sp in params]
        except (TypeError, ValueError) as e:
            raise ValueError(f"sampling_params: each entry must be a dict ({e})") from None
        rids: list[str] = []
        queued = 0
        start_at = min(self.scheduler.chunk_size, START_TOKENS)
        try:
            for prompt, sp in zip(prompts, params, strict=True):
                # Prompts are converted as they are queued, not all first: converting 128 prompts of
                # 2,176 token ids takes ~5 ms of host time, which would delay the first pass.
                ids = self._encode(prompt)
                rid = f"engine-{next(self._ids)}"
                rids.append(rid)
                req = self.scheduler.add_request(_generate_req(rid, ids, sp))
                queued += 0 if req.is_finished else len(ids)  # a refused prompt starts nothing
                if queued >= start_at and self.pipeline.in_flight is None and len(rids) < n:
                    # A pass's worth of prompt tokens is queued: start the device on it and submit
                    # the rest (host work: ~0.1 ms per 1,000 prompt tokens) while it runs.
                    self.step()
                    queued = -(1 << 62)
        except ValueError:
            self._abort(rids)  # a malformed prompt: nothing of this call stays queued or running
            raise
        results = self._run(dict(zip(rids, params, strict=True)))
        return [results[rid] for rid in rids]

    def _abort(self, rids: list[str]) -> None:
        """Abort these requests, let the pass on the device finish, and drop their outputs."""
        for rid in rids:
            self.scheduler.abort(rid)
        while self.pipeline.in_flight is not None:
            self.step()
        self.scheduler.take_outputs()

    def _run(self, params: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        outputs: dict[str, list[int]] = {rid: [] for rid in params}
        done: dict[str, dict[str, Any]] = {}
        sched = self.scheduler
        while len(done) < len(params):
            busy = self.step()
            out, _ = sched.take_outputs()
            if out is None:
                if not busy and sched.is_idle:
                    raise RuntimeError("engine went idle with requests unfinished")
                if not busy:  # queued work, none runnable: a grammar compiling
                    sched.grammar.wait(COMPILE_WAIT_S)
                continue
            new_ids, offsets = out.output_ids.tolist(), out.offsets.tolist()  # one conversion per step
            for i, rid in enumerate(out.rids):
                if rid not in outputs or rid in done:
                    continue
                outputs[rid] += new_ids[offsets[i]:offsets[i + 1]]
                reason = out.finish_reasons[i]
                stop_hit = self._stop_hit(outputs[rid], params[rid].get("stop"))
                if reason is None and stop_hit is not None:
                    sched.abort(rid)
                    reason = "stop"
                if reason is not None:
                    done[rid] = self._result(outputs[rid], reason, stop_hit, out, i)
        while self.pipeline.in_flight is not None:  # drain: leave nothing running on the device
            self.step()
        sched.take_outputs()
        return done

    def step(self) -> bool:
        """Schedule and launch one pass; finish and process the previous one. False when idle.

        The server's pass loop (PassPipeline.step): pass N+1 is built and queued on the device
        before pass N's result is read, so the GPU goes from one pass to the next without waiting
        for this loop; off with disable_overlap_schedule=True. (No late binding: the Engine has no
        arrivals to wait for.)
        """
        return self.pipeline.step()

    def _stop_hit(self, ids: list[int], stop: str | list[str] | None) -> str | None:
        if not stop or self.tokenizer is None:
            return None
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        for s in [stop] if isinstance(stop, str) else stop:
            if s in text:
                return s
        return None

    def _result(self, ids: list[int], reason: str, stop_hit: str | None, out: Any, i: int) -> dict[str, Any]:
        text = self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer else ""
        if stop_hit is not None:
            text = text[:text.index(stop_hit)]
        return {"text": text, "output_ids": ids,
                "meta_info": {"prompt_tokens": out.prompt_tokens[i], "completion_tokens": len(ids),
                              "cached_tokens": out.cached_tokens[i], "finish_reason": reason,
                              "error": out.errors[i]}}

    def stats(self) -> dict[str, Any]:
        return self.scheduler.stats()


GRAMMAR_KEYS = ("regex", "json_schema", "ebnf")


def _generate_req(rid: str, ids: np.ndarray, sp: dict[str, Any]) -> GenerateReq:
    """The GenerateReq of one prompt; the grammar keys of `sp` become its grammar (checked by the
    scheduler's compiler). Raises GrammarError (a ValueError) when `sp` sets two constraints."""
    from radixrt.constrained import spec_from_request

    msg = GenerateReq(rid=rid, input_ids=ids, sampling=sp)
    if any(sp.get(k) is not None for k in GRAMMAR_KEYS):
        spec = spec_from_request(**{k: sp.get(k) for k in GRAMMAR_KEYS})
        if spec is not None:
            msg.grammar_kind, msg.grammar_text = spec.kind.value, spec.text
    return msg
