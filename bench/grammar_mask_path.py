"""Host critical path of a deferred grammar mask in the scheduler process, with no model.

With overlap scheduling a constrained pass N+1 samples only once its GrammarMask arrives, and the
scheduler sends that mask while it handles pass N's result (docs/structured-outputs.md, "Overlap
scheduling: deferred mask rows"). On a GPU the device idles for whatever part of that handling
outlasts N+1's forward, so this measures, per decode pass of an all-constrained load:

  mask_ms   from N's ForwardResult leaving WorkerLink's result socket to N+1's GrammarMask being
            encoded and handed to the worker socket (the critical path)
  after_ms  from the mask's send to the end of the scheduler loop's output flush that follows
            (the rest of process_result, take_outputs and the TokenOutBatch encode)
  result_ms mask_ms + after_ms: the scheduler's whole handling of one result

The scheduler process's real pieces run: `PassPipeline` over `WorkerLink` (scheduler_proc.py), the
`Scheduler`, xgrammar matchers compiled from bench/grammar_bench.py's schema over a synthetic
vocabulary of `--vocab` ids (a bitmask row is vocab / 32 int32 words, as on Qwen2.5's 152,064 ids),
and protocol.encode of every message; the sockets are stand-ins (the worker is a script that samples
an allowed token of each row at once). Figures are medians over the decode passes of `--repeat`
runs. Run it on the tree to compare, e.g. before and after a change:

    .venv/bin/python bench/grammar_mask_path.py                 # 64 requests x 64 output tokens
    PYTHONPATH=/tmp/old-tree .venv/bin/python bench/grammar_mask_path.py   # another radixrt tree
"""

from __future__ import annotations

import argparse
import json
import statistics
import string
import sys
import time
from pathlib import Path
from typing import Any

if not any(Path(p, "radixrt").is_dir() for p in sys.path if p):  # PYTHONPATH may name another tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from radixrt import protocol  # noqa: E402
from radixrt.constrained import GrammarCompilerService, GrammarKind  # noqa: E402
from radixrt.memory.kv_manager import KVManager  # noqa: E402
from radixrt.memory.page_allocator import PageAllocator  # noqa: E402
from radixrt.memory.radix_cache import RadixCache  # noqa: E402
from radixrt.scheduler.pipeline import PassPipeline  # noqa: E402
from radixrt.scheduler.scheduler import Scheduler  # noqa: E402
from radixrt.scheduler.scheduler_proc import WorkerLink  # noqa: E402

PAGE_SIZE = 16


def schema(output_len: int) -> str:
    """bench/grammar_bench.py's schema: a string array that cannot be complete in output_len tokens."""
    return json.dumps({"type": "object", "properties": {"tags": {
        "type": "array", "items": {"type": "string"}, "minItems": output_len + 1}},
        "required": ["tags"], "additionalProperties": False})


def compiler_for(vocab: int) -> GrammarCompilerService:
    """Printable ASCII characters and some short words, then fillers; the last id is EOS."""
    import xgrammar as xgr

    words = list(string.printable[:95]) + ['{"', '":', '["', '","', '"]', '"}', "tags", "ab", "cd"]
    text = words + [f"<f{i}>" for i in range(len(words), vocab - 1)] + ["</s>"]
    return GrammarCompilerService(xgr.TokenizerInfo(text, vocab_size=vocab, stop_token_ids=[vocab - 1]))


class ScriptedWorker:
    """Both sockets of WorkerLink. `send` encodes like ipc.Sender and keeps the messages; `recv`
    answers the oldest pass, sampling a random allowed token of each constrained row."""

    def __init__(self, seed: int) -> None:
        self.passes: list[protocol.ForwardBatch] = []
        self.masks: dict[int, protocol.GrammarMask] = {}
        self.rng = np.random.default_rng(seed)
        self.t_result = 0.0  # when the last result left recv
        self.mask_times: list[tuple[float, float]] = []  # (t_result before it, t sent) per mask

    def send(self, msg: Any) -> None:
        protocol.encode(msg)  # what ipc.Sender.send costs the scheduler before the socket
        if isinstance(msg, protocol.GrammarMask):
            self.masks[msg.batch_id] = msg
            self.mask_times.append((self.t_result, time.perf_counter()))
        else:
            self.passes.append(msg)

    def recv(self, timeout_ms: int | None = None) -> protocol.ForwardResult:
        from radixrt.worker.forward_pass import grammar_rows

        fb = self.passes.pop(0)
        toks = np.full(len(fb.req_rows), 5, np.int32)
        rows, bitmask = grammar_rows(fb, self.masks.pop(fb.batch_id, None))
        for r, i in enumerate(rows.tolist()):
            allowed = np.flatnonzero(np.unpackbits(bitmask[r].view(np.uint8), bitorder="little"))
            toks[i] = int(self.rng.choice(allowed))
        res = protocol.ForwardResult(batch_id=fb.batch_id, next_token_ids=toks)
        self.t_result = time.perf_counter()
        return res


def run_once(ns: argparse.Namespace, compiler: GrammarCompilerService, seed: int) -> dict[str, list[float]]:
    alloc = PageAllocator(ns.num_requests * (ns.prompt_len + ns.output_len) // PAGE_SIZE + 64)
    sched = Scheduler(KVManager(alloc, RadixCache(alloc, PAGE_SIZE), PAGE_SIZE), page_size=PAGE_SIZE,
                      max_running_requests=ns.num_requests, chunk_size=8192, context_len=4096,
                      vocab_size=ns.vocab, eos_token_ids=[ns.vocab - 1])
    sched.grammar.compiler = compiler
    worker = ScriptedWorker(seed)
    pipeline = PassPipeline(sched, WorkerLink(worker, worker, lambda _t: None), overlap=True)
    rng = np.random.default_rng(seed)
    sp = {"temperature": 0.0, "max_new_tokens": ns.output_len, "ignore_eos": True}
    for i in range(ns.num_requests):
        ids = rng.integers(200, ns.vocab - 1, ns.prompt_len).astype(np.int32)
        sched.add_request(protocol.GenerateReq(rid=f"r{i}", input_ids=ids, sampling=sp,
                                               grammar_kind=GrammarKind.JSON_SCHEMA.value,
                                               grammar_text=schema(ns.output_len)))
    out: dict[str, list[float]] = {"mask_ms": [], "after_ms": [], "result_ms": []}
    while pipeline.step() or not sched.is_idle:
        msg, _ = sched.take_outputs()  # SchedulerLoop.flush_outputs
        if msg is not None:
            protocol.encode(msg)
        t_end = time.perf_counter()
        for t_result, t_mask in worker.mask_times:
            out["mask_ms"].append((t_mask - t_result) * 1e3)
            out["after_ms"].append((t_end - t_mask) * 1e3)
            out["result_ms"].append((t_end - t_result) * 1e3)
        worker.mask_times.clear()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=152064)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the medians as one JSON line")
    ns = ap.parse_args(argv)
    compiler = compiler_for(ns.vocab)
    from radixrt.constrained import GrammarSpec

    compiler.compile_now(GrammarSpec(GrammarKind.JSON_SCHEMA, schema(ns.output_len)))  # cached from now on
    runs = [run_once(ns, compiler, seed) for seed in range(ns.repeat + 1)][1:]  # the first run warms up
    med = {k: statistics.median(v for r in runs for v in r[k]) for k in ("mask_ms", "after_ms", "result_ms")}
    med["num_passes"] = sum(len(r["mask_ms"]) for r in runs)
    if ns.json:
        print(json.dumps(med))
    else:
        print(f"{ns.num_requests} constrained requests, W = {(ns.vocab + 31) // 32} words per row; "
              f"medians over {med['num_passes']} passes with a deferred mask")
        for k in ("mask_ms", "after_ms", "result_ms"):
            print(f"  {k:9s} {med[k]:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
