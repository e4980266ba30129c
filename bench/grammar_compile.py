"""Grammar engine costs on the CPU: cold vs cached compile, and the per-step bitmask work.

For each grammar of a small representative set (json_object, a small and a 20-field JSON schema, a
regex, an EBNF grammar) on the model's real tokenizer:
- cold_compile_ms: first submit -> result on a fresh GrammarCompilerService (check + compile);
- cached_compile_ms: the same spec again (a cache hit; must return the same object);
- fill_us_per_request_step: RequestMatcher.fill_bitmask for one request, per decode step, averaged
  over `--batch-size` requests walking the grammar for `--steps` steps (random allowed tokens);
- batch_fill_us_per_request_step: the same on xgrammar's threads (BitmaskFiller forced to use
  them), per request.
Plus the worker-side apply_token_bitmask on [batch, vocab] float32 logits, per backend.

The scheduler budget these numbers answer to: the fill for a step must finish inside the previous
pass's forward time (a few ms for decode), so that masks never delay a pass.

    python bench/grammar_compile.py                       # default model, JSON to stdout
    python bench/grammar_compile.py --steps 128 --batch-size 32 --out bench/results/grammar-cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixrt.constrained import (  # noqa: E402
    BitmaskFiller,
    GrammarCompilerService,
    GrammarKind,
    GrammarSpec,
    RequestMatcher,
    allocate_bitmask,
    apply_token_bitmask,
    build_tokenizer_info,
)

GRAMMAR_FIELDS = ("name", "kind", "cold_compile_ms", "cached_compile_ms", "cached_same_object",
                  "fill_us_per_request_step", "batch_fill_us_per_request_step", "num_resets")
RUN_FIELDS = ("vocab_size", "batch_size", "steps", "tokenizer_info_s", "grammars", "apply_ms_per_step")


def default_grammars() -> list[tuple[str, GrammarSpec]]:
    """The grammars measured: name and spec."""
    small = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
             "required": ["name", "age"]}
    wide = {"type": "object", "required": [f"f{i}" for i in range(20)],
            "properties": {f"f{i}": ({"type": "string", "pattern": "^[a-z]{3,9}$"} if i % 2 else
                                     {"type": "integer", "minimum": 0, "maximum": 10000}) for i in range(20)}}
    return [
        ("json_object", GrammarSpec(GrammarKind.JSON_OBJECT)),
        ("schema_small", GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(small))),
        ("schema_20_fields", GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(wide))),
        ("regex_email", GrammarSpec(GrammarKind.REGEX, r"[a-z0-9._]{1,20}@[a-z]{2,12}\.(com|org|net)")),
        ("ebnf_calc", GrammarSpec(GrammarKind.EBNF, 'root ::= expr\nexpr ::= term (("+" | "-") term)*\n'
                                                    'term ::= [0-9]+ | "(" expr ")"')),
    ]


def _allowed_ids(bitmask: np.ndarray, row: int, vocab_size: int) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(bitmask[row].view(np.uint8), bitorder="little")[:vocab_size])


def _walk_fills(service: GrammarCompilerService, compiled: Any, steps: int, batch: int,
                rng: np.random.Generator) -> tuple[float, float, int]:
    """Drive `batch` matchers `steps` steps on random allowed tokens; returns the mean per-request
    fill time (us) one row at a time, the same through BitmaskFiller, and how often a matcher
    terminated and was reset."""
    matchers = [RequestMatcher(compiled) for _ in range(batch)]
    bitmask = allocate_bitmask(batch, service.vocab_size)
    filler = BitmaskFiller(num_threads=2, min_rows_for_threads=1)
    row_s, batch_s, resets = 0.0, 0.0, 0
    for _ in range(steps):
        t0 = time.perf_counter()
        for i, m in enumerate(matchers):
            m.fill_bitmask(bitmask, i)
        t1 = time.perf_counter()
        filler.fill(matchers, bitmask)
        t2 = time.perf_counter()
        row_s, batch_s = row_s + (t1 - t0), batch_s + (t2 - t1)
        for i, m in enumerate(matchers):
            m.accept_token(int(rng.choice(_allowed_ids(bitmask, i, service.vocab_size))))
            if m.is_terminated:
                m.reset()
                resets += 1
    per = 1e6 / (steps * batch)
    return row_s * per, batch_s * per, resets


def _apply_ms(vocab_size: int, batch: int, repeats: int = 20) -> dict[str, float]:
    bitmask = allocate_bitmask(batch, vocab_size)
    bitmask[:, ::3] = 0
    out = {}
    for backend in ("xgrammar", "torch"):
        times = []
        for _ in range(repeats):
            logits = torch.randn(batch, vocab_size)
            t0 = time.perf_counter()
            apply_token_bitmask(logits, bitmask, backend=backend)
            times.append((time.perf_counter() - t0) * 1e3)
        out[backend] = statistics.median(times)
    return out


def run(tokenizer: Any, *, vocab_size: int | None = None, steps: int = 64, batch_size: int = 8,
        grammars: list[tuple[str, GrammarSpec]] | None = None, seed: int = 0) -> dict[str, Any]:
    """Measure every grammar; returns a dict with RUN_FIELDS, each grammar with GRAMMAR_FIELDS."""
    t0 = time.perf_counter()
    info = build_tokenizer_info(tokenizer, vocab_size=vocab_size)
    info_s = time.perf_counter() - t0
    service = GrammarCompilerService(info, num_threads=2)
    rng = np.random.default_rng(seed)
    rows = []
    try:
        for name, spec in grammars or default_grammars():
            t0 = time.perf_counter()
            compiled = service.submit(spec).result(timeout_s=None)
            t1 = time.perf_counter()
            again = service.submit(spec).result(timeout_s=None)
            t2 = time.perf_counter()
            fill_us, batch_us, resets = _walk_fills(service, compiled, steps, batch_size, rng)
            rows.append({"name": name, "kind": spec.kind.value, "cold_compile_ms": (t1 - t0) * 1e3,
                         "cached_compile_ms": (t2 - t1) * 1e3, "cached_same_object": again is compiled,
                         "fill_us_per_request_step": fill_us, "batch_fill_us_per_request_step": batch_us,
                         "num_resets": resets})
    finally:
        service.shutdown()
    return {"vocab_size": service.vocab_size, "batch_size": batch_size, "steps": steps,
            "tokenizer_info_s": info_s, "grammars": rows,
            "apply_ms_per_step": _apply_ms(service.vocab_size, batch_size)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=None, help="model dir or .gguf (default: the default model)")
    p.add_argument("--steps", type=int, default=64, help="decode steps walked per grammar")
    p.add_argument("--batch-size", type=int, default=8, help="constrained requests per step")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads (1: small CPU ops are dominated by thread hand-off)")
    p.add_argument("--out", default=None, help="write the JSON here (default: stdout)")
    ns = p.parse_args(argv)
    from transformers import AutoTokenizer

    from radixrt.config import Env
    from radixrt.models.loader import resolve_model_dir

    torch.set_num_threads(ns.torch_threads)
    model_dir = resolve_model_dir(ns.model_path, Env.read().cache_dir, "auto")
    vocab = json.loads((model_dir / "config.json").read_text()).get("vocab_size")
    result = {"model_dir": str(model_dir),
              **run(AutoTokenizer.from_pretrained(str(model_dir)), vocab_size=vocab, steps=ns.steps,
                    batch_size=ns.batch_size)}
    text = json.dumps(result, indent=2)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
