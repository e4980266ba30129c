"""`radixrt.Engine`: the offline, in-process engine (same scheduler, cache and worker; no HTTP).

    from radixrt import Engine
    eng = Engine(model_path=None, max_total_tokens=16384)        # default SmolLM2-135M-Instruct
    outs = eng.generate(["The capital of France is"], {"temperature": 0, "max_new_tokens": 8})
    outs[0]["text"], outs[0]["meta_info"]["cached_tokens"]

One loop drives `Scheduler.schedule` -> `ModelRunner.launch` / `finish` -> `Scheduler.process_result`
in this process, with the server's overlap scheduling, so batch jobs and offline throughput
measurements skip the ZeroMQ hops.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from radixrt.config import Env, ServerArgs
from radixrt.gc_policy import freeze_startup_heap
from radixrt.protocol import GenerateReq
from radixrt.scheduler.batch import build_forward_batch, build_mode
from radixrt.scheduler.scheduler_proc import build_scheduler

Prompt = str | Sequence[int]
START_TOKENS = 8192  # generate() starts the first pass once this many prompt tokens are queued


class Engine:
    """Offline generation. Keyword arguments are ServerArgs fields (`model_path`, `page_size`, ...).

    Raises:
        radixrt.models.loader.ModelLoadError: the model cannot be found or read.
        ValueError: a bad ServerArgs value (message names it); from generate, see there.
    """

    def __init__(self, **kwargs: Any) -> None:
        from transformers import AutoTokenizer

        from radixrt.models.loader import resolve_model_dir
        from radixrt.worker.model_runner import ModelRunner

        self.args = ServerArgs(**kwargs)
        self.model_dir: Path = resolve_model_dir(self.args.model_path, Env.read().cache_dir,
                                                 self.args.load_format)
        self.runner = ModelRunner(self.args, self.model_dir)
        self.info = self.runner.info()
        self.scheduler = build_scheduler(self.args, self.info)
        try:  # a dummy-weights directory may hold only config.json: token-id prompts then
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        except (OSError, ValueError):
            self.tokenizer = None
        self._ids = itertools.count()
        self.overlap = not self.args.disable_overlap_schedule
        self._in_flight: tuple[Any, Any, bool] | None = None  # (ScheduledBatch, PendingPass, after_idle)
        self._prev_busy = False
        self.gpu_busy_ms_total = 0.0  # device time in passes (ms)
        self.gpu_gap_ms_total = 0.0  # device idle between consecutive passes while there was work (ms)
        self.num_passes = 0
        self.trace: list[dict[str, Any]] | None = None  # set to [] to record every pass (benchmarks)
        self._host_ms: dict[int, dict[str, float]] = {}  # per in-flight pass, while tracing
        freeze_startup_heap()  # collections on the pass path skip the model and tokenizer objects

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

        A request the scheduler refuses (an empty or too long prompt, token ids outside the
        vocabulary, a bad sampling value such as a negative temperature) comes back with
        finish_reason "abort" and meta_info["error"]; the others still run.

        Raises:
            ValueError: sampling_params is not one dict, or one dict per prompt (before anything
                is queued); a prompt is neither a string nor a flat sequence of integer token ids,
                or is text while the model has no tokenizer. Prompts are converted as they are
                queued, so the requests of this call queued before the bad prompt are aborted
                first: nothing of the call stays queued or running.
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
                req = self.scheduler.add_request(GenerateReq(rid=rid, input_ids=ids, sampling=sp))
                queued += 0 if req.is_finished else len(ids)  # a refused prompt starts nothing
                if queued >= start_at and self._in_flight is None and len(rids) < n:
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
        while self._in_flight is not None:
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
        while self._in_flight is not None:  # drain: leave nothing running on the device
            self.step()
        sched.take_outputs()
        return done

    def step(self) -> bool:
        """Schedule and launch one pass; finish and process the previous one. False when idle.

        The same overlap scheduling as the server (scheduler_proc.SchedulerLoop.step): pass N+1 is
        built and queued on the device before pass N's result is read, so the GPU goes from one
        pass to the next without waiting for this loop; off with disable_overlap_schedule=True.
        """
        sched, runner = self.scheduler, self.runner
        t0 = time.perf_counter()
        sb = sched.schedule()
        launched = None
        if sb is not None:
            t1 = time.perf_counter()
            fb = build_forward_batch(sb)
            t2 = time.perf_counter()
            launched = (sb, runner.launch(fb), not self._prev_busy and self._in_flight is None)
            if self.trace is not None:  # host time of this pass: schedule, build, launch (ms)
                self._host_ms[sb.batch_id] = {"t_s": t0, "num_tokens": len(fb.input_ids),
                                              "schedule_ms": (t1 - t0) * 1e3, "build_ms": (t2 - t1) * 1e3,
                                              "launch_ms": (time.perf_counter() - t2) * 1e3}
        busy = sb is not None or self._in_flight is not None
        self._prev_busy = busy
        if self._in_flight is not None:
            self._complete(*self._in_flight)
        if launched is not None and not self.overlap:
            self._complete(*launched)
            launched = None
        self._in_flight = launched
        return busy

    def _complete(self, sb: Any, pending: Any, after_idle: bool) -> None:
        t0 = time.perf_counter()
        res = self.runner.finish(pending)  # (pending.path stays readable after finish)
        t1 = time.perf_counter()
        self.gpu_busy_ms_total += res.gpu_busy_ms
        if not after_idle and res.gpu_gap_ms >= 0:
            self.gpu_gap_ms_total += res.gpu_gap_ms
        self.num_passes += 1
        host = self._host_ms.pop(sb.batch_id, {})
        if self.trace is not None:
            s = self.scheduler.stats()
            self.trace.append({"batch_size": len(sb), "mode": int(build_mode(sb)), "busy_ms": res.gpu_busy_ms,
                               "gap_ms": -1.0 if after_idle else res.gpu_gap_ms, "cascade": sb.cascade is not None,
                               "path": pending.path,
                               "kv_slots_allocated": s["running_kv_slots_allocated"],
                               "kv_slots_unused": s["running_kv_slots_unused"],
                               "wait_ms": (t1 - t0) * 1e3, **host})
        self.scheduler.process_result(sb, res)
        if self.trace is not None:
            self.trace[-1]["process_ms"] = (time.perf_counter() - t1) * 1e3

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
