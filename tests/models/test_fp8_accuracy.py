"""FP8 weights (--quantization fp8) against the fp32 weights of the default model (SmolLM2-135M), CPU.

Teacher-forced: each fixed text (prompt + a continuation) runs once through both models; every
position's next-token distribution is compared. The CPU FP8 path is the one the GPU takes for
M > 16 rows: per-token FP8 activations and per-channel FP8 weights through torch._scaled_mm.

Bounds, from the measured values (2026-12-01, this machine; torch 2.13 CPU): mean KL(fp32 || fp8)
over the 8 texts' 165 positions 0.036 nats, worst single position 0.40; top-1 agreement 0.885;
the first greedy token after every prompt the same. SmolLM2-135M has activations of ~3,000 in a few
channels, which per-token FP8 scales coarsen for the rest of the row; larger models fare better.

The first greedy token after each prompt must be the fp32 model's where fp32 prefers it to its second
choice by at least NEAR_TIE_NATS, and one of fp32's top two where it does not: torch's CPU
`_scaled_mm` rounds differently on different CPUs, and on a 2-vCPU Intel Xeon VM (AVX-512, AMX;
2026-12-02) the FP8 LM head picked fp32's second token after "My favourite fruit is", whose top two
are 0.62 nats apart (mean KL there 0.065 nats, max 0.62), where the AMD EPYC VM of 2026-12-01/02
picked the first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixrt.config import ServerArgs
from radixrt.worker.model_runner import ModelRunner
from tests.worker.driver import single_request_batch

pytestmark = pytest.mark.usefixtures("one_thread")

MEAN_KL_BOUND = 0.08  # nats, mean over every position of every text
TOP1_AGREEMENT_MIN = 0.8
NEAR_TIE_NATS = 1.0  # fp32's top-2 log-prob gap below which FP8 may pick either of the two
# (prompt, continuation): the first greedy token after the prompt must agree (module docstring)
TEXTS = [
    ("The capital of France is", " Paris. It is known for the Eiffel Tower and its museums."),
    ("def fibonacci(n):", "\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fib"),
    ("Water boils at a temperature of", " 100 degrees Celsius at sea level."),
    ("Once upon a time, there was a", " small town nestled in the heart of a forest."),
    ("The three primary colors are", " red, blue and yellow."),
    ("import numpy as np\nx = np.", "array([1, 2, 3])\nprint(x.sum())"),
    ("Q: What is 12 times 12?\nA:", " 12 times 12 is 144."),
    ("My favourite fruit is", " a strawberry, because it is sweet."),
]


def _all_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """Logits [T, V] float32 at every position of one EXTEND pass over `ids`."""
    meta, input_ids, _ = runner.stage(single_request_batch(ids, page_size=runner.page_size))
    with torch.inference_mode():
        runner.backend.prepare(meta)
        hidden = runner.model(input_ids, meta.positions, meta, runner.backend)
        return runner.model.compute_logits(hidden)


def _runner(model_dir: Path, quantization: str | None, lm_head: str = "auto") -> ModelRunner:
    args = ServerArgs(device="cpu", page_size=4, max_total_tokens=1024, max_running_requests=1,
                      quantization=quantization, lm_head_quantization=lm_head)
    return ModelRunner(args, model_dir)


# lm_head "auto" quantizes the (tied) LM head too under --quantization fp8 of this bf16 checkpoint;
# "none" keeps it in the model dtype. Measured 2026-12-02 (2-core CPU VM, torch CPU, the W8A8 path, which
# also quantizes the final hidden state per token): auto mean KL 0.0706 nats (max 0.703), top-1 0.886;
# none 0.0367 (max 0.403), 0.937; the first greedy token equal on 8/8 prompts in both.
@pytest.mark.parametrize("lm_head", ["auto", "none"])
def test_fp8_weights_track_fp32_on_the_default_model(model_dir: Path, lm_head: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ref, fp8 = _runner(model_dir, None), _runner(model_dir, "fp8", lm_head)
    assert type(fp8.model.model.layers[0].mlp.down_proj).__name__ == "Fp8Linear"
    head = type(fp8.model.lm_head).__name__
    assert head == ("Fp8Linear" if lm_head == "auto" else "Linear")
    assert fp8.model.model.embed_tokens.weight.dtype == torch.float32  # the embedding is never FP8
    kls, agree = [], []
    for prompt, cont in TEXTS:
        p_ids = tok(prompt)["input_ids"]
        ids = p_ids + tok(cont)["input_ids"]
        a, b = _all_logits(ref, ids).log_softmax(-1), _all_logits(fp8, ids).log_softmax(-1)
        kls.append((a.exp() * (a - b)).sum(-1))  # [T]
        agree.append(a.argmax(-1) == b.argmax(-1))
        last = len(p_ids) - 1
        top2 = a[last].topk(2)
        pick = int(b[last].argmax())
        if float(top2.values[0] - top2.values[1]) >= NEAR_TIE_NATS:
            assert pick == int(top2.indices[0]), f"first greedy token differs after {prompt!r}"
        else:
            assert pick in top2.indices.tolist(), f"first greedy token after {prompt!r} not in fp32's top 2"
    kl, top1 = torch.cat(kls), torch.cat(agree).float()
    assert torch.isfinite(kl).all()
    print(f"lm_head {lm_head}: mean KL {float(kl.mean()):.4f} (max {float(kl.max()):.3f}), "
          f"top-1 {float(top1.mean()):.3f}")
    assert float(kl.mean()) < MEAN_KL_BOUND, f"mean KL {float(kl.mean()):.4f} (max {float(kl.max()):.3f})"
    assert float(top1.mean()) >= TOP1_AGREEMENT_MIN, f"top-1 agreement {float(top1.mean()):.3f}"
