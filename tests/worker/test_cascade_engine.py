"""Cascade attention through the whole worker (CPU, Triton interpreter): an Engine on a tiny random
Llama with the triton backend gives the same greedy tokens with cascade grouping forced on as with
it off, while many requests share prefix pages."""

from __future__ import annotations

import random
from pathlib import Path

from radixrt.engine import Engine
from tests.models.tiny import save_tiny_model

GREEDY = {"temperature": 0.0, "max_new_tokens": 3, "ignore_eos": True}  # two decode passes


def test_cascade_decode_gives_the_same_tokens(tmp_path: Path) -> None:
    model_dir = tmp_path / "tiny"
    save_tiny_model("llama", model_dir)
    rng = random.Random(3)
    system = [rng.randrange(3, 290) for _ in range(40)]
    prompts = [system + [rng.randrange(3, 290) for _ in range(rng.randrange(1, 9))] for _ in range(5)]
    prompts.append([rng.randrange(3, 290) for _ in range(20)])  # in no group
    outs = {}
    for cascade in (False, True):
        eng = Engine(model_path=str(model_dir), device="cpu", attention_backend="triton", page_size=4,
                     max_total_tokens=2048, max_running_requests=8, disable_cascade_attention=not cascade)
        if cascade:
            eng.scheduler.cascade_min_saved_tokens = 1  # group even these short prefixes
        outs[cascade] = [o["output_ids"] for o in eng.generate(prompts, GREEDY)]
        assert eng.scheduler.num_cascade_passes > 0 if cascade else eng.scheduler.num_cascade_passes == 0
    assert outs[True] == outs[False]
