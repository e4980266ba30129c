"""Deferred grammar rows on the worker (overlap scheduling): a pass whose mask rows follow in a
GrammarMask runs its forward at once and samples only once the mask is there.

The serve loop (worker_proc._serve) must send the pending result before it blocks on the mask (the
scheduler sends the mask after reading that result); the ModelRunner samples a deferred pass
exactly as it would have with the rows in the batch."""

from __future__ import annotations

import numpy as np
import pytest

from radixrt import protocol
from radixrt.config import ServerArgs
from radixrt.constrained import allocate_bitmask
from radixrt.worker.model_runner import ModelRunner
from radixrt.worker.worker_proc import _serve
from tests.models.tiny import BASE, write_config
from tests.worker.driver import single_request_batch
from tests.worker.test_worker_loop import FakeRunner, Inbox, Results, batch


class MaskRunner(FakeRunner):
    def supply_mask(self, pending: int, mask: protocol.GrammarMask) -> None:
        self.log.append(f"mask {mask.batch_id}")


def deferred(i: int) -> protocol.ForwardBatch:
    fb = batch(i)
    fb.grammar_deferred = np.array([0], np.int32)
    return fb


def mask_for(i: int) -> protocol.GrammarMask:
    return protocol.GrammarMask(batch_id=i, rows=np.array([0], np.int32), bitmask=allocate_bitmask(1, 64))


def test_the_pending_result_is_sent_before_waiting_for_the_mask() -> None:
    log: list[str] = []
    inbox = Inbox([batch(0), deferred(1), mask_for(1), deferred(2), mask_for(2),
                   protocol.WorkerControl("shutdown")])
    _serve(MaskRunner(log, done_after_polls=10), inbox, Results(log))
    assert log == ["launch 0", "launch 1", "finish 0", "send 0", "mask 1",
                   "launch 2", "finish 1", "send 1", "mask 2", "finish 2", "send 2"]


def test_shutdown_while_waiting_for_a_mask_exits_and_a_wrong_message_is_an_error() -> None:
    log: list[str] = []
    inbox = Inbox([batch(0), deferred(1), protocol.WorkerControl("shutdown")])
    _serve(MaskRunner(log, done_after_polls=0), inbox, Results(log))
    assert log == ["launch 0", "finish 0", "send 0", "launch 1"]  # pass 1 is dropped unsampled
    with pytest.raises(ValueError, match="awaits its GrammarMask"):
        _serve(MaskRunner([], 0), Inbox([deferred(0), batch(1)]), Results([]))
    with pytest.raises(ValueError, match="no pass awaits"):
        _serve(MaskRunner([], 0), Inbox([mask_for(0)]), Results([]))


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> ModelRunner:
    d = write_config(tmp_path_factory.mktemp("m") / "m", architectures=["LlamaForCausalLM"],
                     model_type="llama", **BASE)
    args = ServerArgs(device="cpu", load_format="dummy", page_size=4, max_total_tokens=64,
                      max_running_requests=2, random_seed=3)
    return ModelRunner(args, d)


def one_token_mask(vocab: int, tok: int) -> np.ndarray:
    bm = allocate_bitmask(1, vocab)
    bm[:] = 0
    bm[0, tok // 32] = np.int32(np.uint32(1 << (tok % 32)).view(np.int32))
    return bm


def test_runner_samples_a_deferred_pass_once_its_mask_arrives(runner: ModelRunner) -> None:
    vocab = runner.config.vocab_size
    prompt = [5, 9, 14, 3, 7]
    free = runner.forward(single_request_batch(prompt, batch_id=1)).next_token_ids.tolist()
    tok = (free[0] + 17) % vocab  # not the greedy choice: only the mask can make it the sample
    fb = single_request_batch(prompt, batch_id=2)
    fb.grammar_deferred = np.array([0], np.int32)
    pending = runner.launch(fb)
    assert not runner.poll(pending)  # it has not sampled: finishing would never end
    with pytest.raises(ValueError, match="GrammarMask"):
        runner.finish(pending)
    with pytest.raises(ValueError, match="awaits its GrammarMask"):  # the next pass reads its token
        runner.launch(single_request_batch(prompt, batch_id=3))
    with pytest.raises(ValueError, match="need their GrammarMask"):  # rows that differ
        wrong_rows = protocol.GrammarMask(2, np.array([1], np.int32), one_token_mask(vocab, tok))
        runner.supply_mask(pending, wrong_rows)
    fb = single_request_batch(prompt, batch_id=4)
    fb.grammar_deferred = np.array([0], np.int32)
    pending = runner.launch(fb)
    runner.supply_mask(pending, protocol.GrammarMask(4, np.array([0], np.int32), one_token_mask(vocab, tok)))
    res = runner.finish(pending)
    assert res.next_token_ids.tolist() == [tok] and res.gpu_busy_ms >= 0
    # the same rows sent in the batch itself sample the same token
    fb = single_request_batch(prompt, batch_id=5)
    fb.grammar_rows, fb.grammar_bitmask = np.array([0], np.int32), one_token_mask(vocab, tok).reshape(-1)
    assert runner.forward(fb).next_token_ids.tolist() == [tok]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_batch_rows_and_deferred_rows_upload_as_one_bitmask_in_row_order(device: str) -> None:
    """The worker's bitmask upload (forward_pass.upload_bitmask): the batch's own rows, then the
    mask's deferred ones, as one [R + D, W] tensor equal to the joined host arrays."""
    import torch

    from radixrt.worker.forward_pass import grammar_blocks, grammar_rows, upload_bitmask

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rng = np.random.default_rng(0)
    fb = batch(3)
    fb.grammar_rows = np.array([2], np.int32)
    fb.grammar_bitmask = rng.integers(-2**31, 2**31, (1, 5), dtype=np.int64).astype(np.int32)
    fb.grammar_deferred = np.array([0, 1], np.int32)
    bits = rng.integers(-2**31, 2**31, (2, 5), dtype=np.int64).astype(np.int32)
    # as decoded off a socket: read-only views of the frames
    mask = protocol.GrammarMask(3, np.frombuffer(fb.grammar_deferred.tobytes(), np.int32),
                                np.frombuffer(bits.tobytes(), np.int32).reshape(2, 5))
    rows, blocks = grammar_blocks(fb, mask)
    assert rows.tolist() == [2, 0, 1] and len(blocks) == 2
    got = upload_bitmask(blocks, torch.device(device))
    want = np.concatenate([fb.grammar_bitmask, bits])
    assert got.device.type == device and got.dtype == torch.int32
    assert np.array_equal(got.cpu().numpy(), want)
    assert np.array_equal(grammar_rows(fb, mask)[1], want)
    with pytest.raises(ValueError, match="need their GrammarMask"):
        grammar_blocks(fb, protocol.GrammarMask(3, np.array([1, 0], np.int32), bits))
