"""RADIXRT_PASS_TRACE: one JSON line per pass, in order, matching what the pipeline ran."""

from __future__ import annotations

import json
import random
from pathlib import Path

from radixrt.config import Env
from radixrt.scheduler.pass_trace import FLUSH_EVERY, PassTrace, maybe_trace
from radixrt.scheduler.pipeline import PassPipeline
from tests.scheduler.test_chunking import Launcher, make, prompt
from tests.scheduler.test_scheduler import gen


def test_trace_lines_match_the_passes_the_pipeline_launched(tmp_path: Path) -> None:
    sched, worker, _ = make(chunk=256)
    launcher = Launcher(worker)
    pipeline = PassPipeline(sched, launcher, overlap=True)
    path = tmp_path / "trace.jsonl"
    trace = PassTrace(path, pipeline)
    rng = random.Random(3)
    sched.add_request(gen("long", prompt(rng, 600), 3))  # three prompt chunks of at most 256
    sched.add_request(gen("short", prompt(rng, 20), 5))
    while pipeline.step():
        pass
    trace.idle()  # what the scheduler loop calls once nothing is in flight
    lines = [json.loads(s) for s in path.read_text().splitlines()]
    assert len(lines) == len(launcher.launched) == pipeline.num_passes
    for rec, fb in zip(lines, launcher.launched, strict=True):
        ext = [n for n in fb.extend_lens.tolist() if n > 1]
        assert rec["tokens"] == len(fb.input_ids)
        assert (rec["extend_reqs"], rec["extend_tokens"]) == (len(ext), sum(ext))
        assert rec["decode_reqs"] == len(fb.extend_lens) - len(ext)
    assert [r["t_s"] for r in lines] == sorted(r["t_s"] for r in lines)
    # every prompt token once in an extend; every output after a request's first from a decode row
    assert sum(r["extend_tokens"] for r in lines) == 600 + 20
    assert sum(r["decode_reqs"] for r in lines) == (3 - 1) + (5 - 1)
    assert lines[0]["extend_tokens"] == 256 and all(r["waiting"] == 0 for r in lines)
    assert lines[0]["running"] == 2 and lines[-1]["running"] == 1  # "short" outlives "long"
    trace.close()
    trace.close()  # idempotent, and the hook is gone: later passes are not traced
    sched.add_request(gen("after", prompt(rng, 10), 2))
    while pipeline.step():
        pass
    assert len(path.read_text().splitlines()) == len(lines)


def test_records_are_written_in_batches_and_the_env_switch(tmp_path: Path, monkeypatch) -> None:
    sched, worker, _ = make()
    pipeline = PassPipeline(sched, Launcher(worker), overlap=False)
    path = tmp_path / "t.jsonl"
    trace = maybe_trace(pipeline, path)
    assert trace is not None and maybe_trace(pipeline, None) is None
    sched.add_request(gen("r", prompt(random.Random(1), 8), FLUSH_EVERY + 10))
    for _ in range(FLUSH_EVERY):  # a prompt pass, then decodes: FLUSH_EVERY records complete
        pipeline.step()
    # FLUSH_EVERY - 1 records are queued (the last waits for its process_ms): nothing written yet
    assert not path.exists() or path.read_text() == ""
    pipeline.step()
    assert len(path.read_text().splitlines()) == FLUSH_EVERY
    trace.close()
    monkeypatch.setenv("RADIXRT_PASS_TRACE", str(path))
    assert Env.read().pass_trace == path
    monkeypatch.setenv("RADIXRT_PASS_TRACE", "")
    assert Env.read().pass_trace is None
