"""The wire protocol (typed messages, raw array frames, closed sets) and the ipc directory."""

from __future__ import annotations

import dataclasses
import os
import stat

import numpy as np
import orjson
import pytest

from radixrt import protocol
from radixrt.ipc import IpcAddresses, remove_stale_dirs


def test_forward_batch_round_trip_keeps_arrays_and_scalars() -> None:
    fb = protocol.ForwardBatch(batch_id=7, mode=int(protocol.ForwardMode.MIXED),
                               input_ids=np.array([5, 0, 9], np.int32),
                               prev_token_pos=np.array([1], np.int32), prev_token_src=np.array([3], np.int32),
                               temperature=np.array([0.0, 0.7], np.float32), return_logprob=True)
    frames = protocol.encode(fb)
    num_arrays = sum(isinstance(getattr(fb, f.name), np.ndarray) for f in dataclasses.fields(fb))
    assert len(frames) == 1 + num_arrays  # header + one raw frame per array field
    out = protocol.decode(frames, protocol.SCHEDULER_TO_WORKER)
    assert isinstance(out, protocol.ForwardBatch) and out.batch_id == 7 and out.return_logprob
    assert out.input_ids.dtype == np.int32 and out.input_ids.tolist() == [5, 0, 9]
    assert out.prev_token_pos.tolist() == [1] and out.prev_token_src.tolist() == [3]
    assert out.temperature.tolist() == pytest.approx([0.0, 0.7])


def test_token_out_batch_round_trip() -> None:
    tb = protocol.TokenOutBatch(rids=["a", "b"], offsets=np.array([0, 1, 3], np.int32),
                                output_ids=np.array([4, 5, 6], np.int32), finish_reasons=[None, "stop"],
                                prompt_tokens=[3, 4], completion_tokens=[1, 2], cached_tokens=[0, 2],
                                errors=[None, None], matched_stop=[None, 2], top_logprobs_nums=[0, 2])
    out = protocol.decode(protocol.encode(tb), protocol.SCHEDULER_TO_TOKENIZER)
    assert out.rids == ["a", "b"] and out.output_ids.tolist() == [4, 5, 6]
    assert out.finish_reasons == [None, "stop"] and out.matched_stop == [None, 2]
    assert out.top_logprobs_nums == [0, 2]


def test_decode_accepts_only_the_channel_closed_set() -> None:
    frames = protocol.encode(protocol.AbortReq(rid="x"))
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(frames, protocol.SCHEDULER_TO_WORKER)  # an AbortReq never goes to the worker
    assert protocol.decode(frames, protocol.TOKENIZER_TO_SCHEDULER).rid == "x"


@pytest.mark.parametrize("mangle", ["bad_json", "unknown_type", "bad_dtype", "short_frame", "extra_field"])
def test_malformed_messages_raise_protocol_error(mangle: str) -> None:
    frames = protocol.encode(protocol.GenerateReq(rid="r", input_ids=np.arange(4, dtype=np.int32)))
    header = orjson.loads(frames[0])
    if mangle == "bad_json":
        frames[0] = b"{not json"
    elif mangle == "unknown_type":
        header["t"] = "Pickle"
    elif mangle == "bad_dtype":
        header["a"][0][1] = "|O"  # object arrays would need pickle
    elif mangle == "short_frame":
        frames[1] = frames[1][:-4]
    else:
        header["f"]["surprise"] = 1
    if mangle != "bad_json" and mangle != "short_frame":
        frames[0] = orjson.dumps(header)
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(frames, protocol.TOKENIZER_TO_SCHEDULER)


def test_ipc_dir_is_private_and_removed(tmp_path) -> None:
    addrs = IpcAddresses.create()
    try:
        assert stat.S_IMODE(os.stat(addrs.dir).st_mode) == 0o700
        assert addrs.worker_in.startswith(f"ipc://{addrs.dir}/")
        assert os.path.basename(addrs.dir).startswith(f"radixrt-{os.getpid()}-")
    finally:
        addrs.cleanup()
    assert not os.path.exists(addrs.dir)


def test_stale_dirs_of_dead_launchers_are_removed(tmp_path) -> None:
    dead = tmp_path / "radixrt-999999999-abc"  # above the kernel's pid limit: never alive
    alive = tmp_path / f"radixrt-{os.getpid()}-def"
    other = tmp_path / "radixrt-notapid"
    for d in (dead, alive, other):
        d.mkdir()
    assert remove_stale_dirs(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and alive.exists() and other.exists()


@pytest.mark.parametrize("num_ids", [2176, 40_000])  # 8.7 KB: a copied frame; 160 KB: a zero-copy view
def test_sender_delivers_array_frames_intact(tmp_path, num_ids: int) -> None:
    import zmq

    from radixrt.ipc import Receiver, Sender

    ctx = zmq.Context()
    addr = f"ipc://{tmp_path}/ch"
    rx = Receiver(ctx, addr, protocol.TOKENIZER_TO_SCHEDULER)
    tx = Sender(ctx, addr)
    try:
        ids = np.arange(num_ids, dtype=np.int32)
        tx.send(protocol.GenerateReq(rid="r", input_ids=ids, sampling={"max_new_tokens": 3}))
        got = rx.recv(timeout_ms=5000)
        assert isinstance(got, protocol.GenerateReq) and got.sampling == {"max_new_tokens": 3}
        assert got.input_ids.dtype == np.int32 and np.array_equal(got.input_ids, ids)
    finally:
        rx.sock.close(linger=0)
        tx.sock.close(linger=0)
        ctx.term()


def test_sampling_params_to_dict_is_asdict_with_copied_containers() -> None:
    from radixrt.sampling_params import SamplingParams

    sp = SamplingParams(temperature=0.5, stop=["\n"], stop_token_ids=[7], logit_bias={"3": -1.0}, seed=9)
    d = sp.to_dict()
    assert d == dataclasses.asdict(sp) and list(d) == [f.name for f in dataclasses.fields(sp)]
    d["stop"].append("x")
    d["logit_bias"]["4"] = 1.0
    assert sp.stop == ["\n"] and sp.logit_bias == {"3": -1.0}
    assert SamplingParams.from_dict({**d, "unknown": 1}).stop == ["\n", "x"]


def test_sampler_seeds_keep_small_seeds_and_mix_the_rest() -> None:
    """sampler_seed: seeds in [0, 2^31) unchanged (their streams stay what they were); 2^31, 2^32,
    2^63 - 1 and negatives are mixed into 31 bits instead of masked, so they no longer draw exactly
    the tokens of 0, 0, 2^31 - 1 and 2^31 - 1 (the masked values); always in [0, 2^31).
    offset_seed (n > 1 choices) wraps within int64."""
    from radixrt.sampling_params import offset_seed, sampler_seed

    for s in (0, 1, 12345, (1 << 31) - 1):
        assert sampler_seed(s) == s
    mixed = {s: sampler_seed(s) for s in (1 << 31, 1 << 32, (1 << 63) - 1, -1, -(1 << 63))}
    assert all(0 <= v < 1 << 31 for v in mixed.values())
    assert mixed[1 << 31] != 0 and mixed[1 << 32] != 0 and mixed[-1] != (1 << 31) - 1
    assert len(set(mixed.values())) == len(mixed)
    assert offset_seed(5, 2) == 7 and offset_seed((1 << 63) - 1, 1) == -(1 << 63)
