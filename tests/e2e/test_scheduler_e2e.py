"""The scheduler under chunking and memory pressure, on the real default model (offline Engine)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from radixrt.engine import Engine
from radixrt.protocol import GenerateReq

GREEDY = {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True}


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(9)
    return [[rng.randrange(100, 20000) for _ in range(n)] for n in (150, 97, 180, 33, 160, 120)]


@pytest.fixture(scope="module")
def unchunked(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    eng = Engine(model_path=str(model_dir), chunked_prefill_size=-1, max_total_tokens=8192, device="cpu")
    return [o["output_ids"] for o in eng.generate(prompts, GREEDY)]


def test_chunked_prefill_gives_the_same_tokens(model_dir: Path, prompts, unchunked) -> None:
    """Prompts longer than the chunk (several chunks each, mixed with other requests' decodes)."""
    eng = Engine(model_path=str(model_dir), chunked_prefill_size=48, max_total_tokens=8192, device="cpu")
    assert [o["output_ids"] for o in eng.generate(prompts, GREEDY)] == unchunked


def test_workload_several_times_the_pool_completes_correctly(model_dir: Path, prompts, unchunked) -> None:
    """A pool of 256 tokens for ~840 tokens of work: eviction and retraction, same tokens, no leak."""
    eng = Engine(model_path=str(model_dir), max_total_tokens=256, page_size=16, chunked_prefill_size=64,
                 device="cpu")
    outs = eng.generate(prompts, GREEDY)
    assert [o["output_ids"] for o in outs] == unchunked
    assert eng.scheduler.num_retractions > 0
    eng.scheduler.check_invariants()
    assert eng.scheduler.kv.stats()["num_protected_pages"] == 0


def test_engine_overlap_on_and_off_give_the_same_tokens(model_dir: Path, prompts, unchunked) -> None:
    """The Engine's loop launches pass N+1 before reading pass N (overlap scheduling) by default;
    greedy and seeded sampling give the same tokens with it off, and device time is accounted."""
    eng = Engine(model_path=str(model_dir), chunked_prefill_size=64, max_total_tokens=8192, device="cpu")
    assert eng.overlap
    seeded = {"temperature": 0.9, "top_p": 0.9, "seed": 5, "max_new_tokens": 12, "ignore_eos": True}
    on = [o["output_ids"] for o in eng.generate(prompts, GREEDY)]
    on_seeded = [o["output_ids"] for o in eng.generate(prompts[:3], seeded)]
    assert eng.pipeline.gpu_busy_ms_total > 0 and eng.pipeline.num_passes > 0
    eng.overlap = False
    assert [o["output_ids"] for o in eng.generate(prompts, GREEDY)] == on == unchunked
    assert [o["output_ids"] for o in eng.generate(prompts[:3], seeded)] == on_seeded
    eng.scheduler.check_invariants()
    assert eng.scheduler.kv.stats()["num_protected_pages"] == 0


def test_engine_starts_the_device_before_every_prompt_is_queued(model_dir: Path, prompts, unchunked) -> None:
    """generate() launches the first pass once a chunk's worth of prompt tokens is queued and
    submits the rest while it runs; the tokens are those of the unchunked run. Prompts are converted
    as they are queued: a malformed one raises ValueError and aborts those queued (and started)
    before it, leaving nothing queued, running or locked, and later calls undisturbed."""
    eng = Engine(model_path=str(model_dir), chunked_prefill_size=48, max_total_tokens=8192, device="cpu")
    events: list[str] = []
    add, launch = eng.scheduler.add_request, eng.runner.launch
    eng.scheduler.add_request = lambda *a, **k: (events.append("add"), add(*a, **k))[1]
    eng.runner.launch = lambda *a, **k: (events.append("launch"), launch(*a, **k))[1]
    assert [o["output_ids"] for o in eng.generate(prompts, GREEDY)] == unchunked
    assert events.index("launch") < len(prompts) - 1 and events.count("add") == len(prompts)
    events.clear()
    for bad in ([1, 2.5], [[1, 2]], ["a"]):
        with pytest.raises(ValueError, match="prompt"):
            eng.generate([*prompts, bad], GREEDY)
        assert eng.scheduler.is_idle and eng.pipeline.in_flight is None
        assert eng.scheduler.take_outputs()[0] is None  # nothing of the aborted call is delivered later
        eng.scheduler.check_invariants()
        assert eng.scheduler.kv.stats()["num_protected_pages"] == 0
    assert events.count("add") == 3 * len(prompts) and "launch" in events  # queued, started, aborted
    assert [o["output_ids"] for o in eng.generate(prompts, GREEDY)] == unchunked


def test_engine_prompt_forms_and_bad_sampling_params(model_dir: Path, prompts, unchunked) -> None:
    """numpy prompts (one [T] array, an [N, T] array, numpy ints) are token ids; a bad sampling entry
    for a later prompt is refused before anything is queued or launched; a pass hook records exactly
    the passes completed while it is registered."""
    eng = Engine(model_path=str(model_dir), chunked_prefill_size=48, max_total_tokens=8192, device="cpu")
    one = {**GREEDY, "max_new_tokens": 4}
    want = [o[:4] for o in unchunked]
    assert [o["output_ids"] for o in eng.generate(np.array(prompts[0]), one)] == want[:1]
    assert [o["output_ids"] for o in eng.generate([np.int64(t) for t in prompts[0]], one)] == want[:1]
    same_len = [p[:30] for p in prompts[:3]]
    assert len(eng.generate(np.array(same_len), one)) == 3
    for bad in (None, "ab", 3):
        with pytest.raises(ValueError, match="sampling_params"):
            eng.generate(prompts[:3], [one, one, bad])
        assert eng.scheduler.is_idle and eng.pipeline.in_flight is None
    seen = []  # a pass hook sees each pass completed while it is registered, and no other
    remove = eng.pipeline.add_pass_hook(seen.append)
    eng.scheduler.add_request(GenerateReq(rid="t", input_ids=np.array(prompts[1]), sampling=one))
    eng.step()  # launches the first prompt chunk (48 of its 97 tokens)
    eng.step()  # launches the next chunk, completes the first
    remove()
    while eng.step():
        pass
    assert [(r.num_tokens, len(r.sb)) for r in seen] == [(48, 1)]
    assert seen[0].process_ms > 0 and eng.pipeline.in_flight is None and eng.scheduler.is_idle


def test_a_request_at_the_context_limit_fits_beside_a_cached_mid_page_prefix(model_dir: Path, caplog) -> None:
    """A pool no larger than the model's context caps the context at the pool less one page: a
    request that shares a cached prefix ending inside a page copies that page (copy on write) while
    the tree keeps the original, so it needs one page more than its own tokens. Before the cap, a
    prompt that fit the pool alone was refused, and a decode up to the context cut short, when it
    shared such a prefix (found by a break test: --max-total-tokens 2048)."""
    eng = Engine(model_path=str(model_dir), max_total_tokens=512, page_size=16, chunked_prefill_size=128,
                 device="cpu")
    ctx = eng.scheduler.context_len
    assert ctx == 512 - 16
    assert "capped at 496: the KV pool holds 512 tokens" in caplog.text  # said where an operator looks
    rng = random.Random(3)
    base = [rng.randrange(100, 20000) for _ in range(200)]  # 12 pages + 8 tokens, cached below
    eng.generate([base], {"temperature": 0.0, "max_new_tokens": 1})
    prompt = base + [rng.randrange(100, 20000) for _ in range(ctx - 1 - len(base))]
    out = eng.generate([prompt], {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True})[0]
    assert out["meta_info"].get("error") is None and out["meta_info"]["completion_tokens"] == 1
    assert out["meta_info"]["cached_tokens"] >= 192  # the shared prefix was used (whole pages at least)
    decode = eng.generate([base[:199] + [5]], {"temperature": 0.0, "max_new_tokens": ctx - 200,
                                               "ignore_eos": True})[0]
    assert decode["meta_info"]["completion_tokens"] == ctx - 200  # up to the context, not cut short
    eng.scheduler.check_invariants()
    assert eng.scheduler.kv.stats()["num_protected_pages"] == 0
