"""kernels/l2_prefetch.py: the weight prefetch into L2 reads exactly the requested words and writes
nothing but the impossible-in-practice xor (CPU through the Triton interpreter; the L2 hint is the
GPU's). The model's wiring is in tests/models/test_l2_prefetch_model.py, the engine on CUDA in
tests/worker/test_gpu_model.py."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels.l2_prefetch import PREFETCH_WORDS, prefetch_l2, prefetch_programs

from .conftest import DEVICE

MAGIC = 0x7EADBEEF
SENTINEL = -5


def _words_with_magic_xor(programs: int, magic_program: int, fix: int = 7) -> torch.Tensor:
    """Random non-zero int32 words whose xor over program `magic_program`'s chunk is MAGIC (fixed up
    at word `fix` of that chunk); every other chunk's xor is something else."""
    gen = torch.Generator().manual_seed(programs)
    w = torch.randint(1, 2**31 - 1, (programs * PREFETCH_WORDS,), generator=gen, dtype=torch.int64)
    w = w.to(torch.int32)
    for p in range(programs):
        chunk = w[p * PREFETCH_WORDS:(p + 1) * PREFETCH_WORDS]
        x = 0
        for v in chunk.tolist():
            x ^= v
        if p == magic_program:
            chunk[fix] ^= x ^ MAGIC  # now the chunk's xor is MAGIC
        elif x == MAGIC:
            chunk[0] ^= 1
    return w.to(DEVICE)


def _sink(n: int = 8) -> torch.Tensor:
    return torch.full((n,), SENTINEL, dtype=torch.int32, device=DEVICE)


def test_reads_the_requested_words_and_writes_only_the_magic_xor() -> None:
    w = _words_with_magic_xor(3, 1)
    sink = _sink()
    prefetch_l2(w, w.numel() * 4, sink)
    # program 1 read all of its words (their xor is MAGIC); programs 0 and 2, whose xors are other
    # non-zero values, wrote nothing
    assert sink.tolist() == [SENTINEL, MAGIC] + [SENTINEL] * 6
    sink = _sink()
    prefetch_l2(w, PREFETCH_WORDS * 4 + 28, sink)  # chunk 1 up to word 7 exclusive: its xor is not MAGIC
    assert prefetch_programs(PREFETCH_WORDS * 4 + 28) == 2 and sink.tolist() == [SENTINEL] * 8
    w2 = _words_with_magic_xor(3, 1, fix=PREFETCH_WORDS - 1)
    prefetch_l2(w2, 2 * PREFETCH_WORDS * 4 - 4, sink)  # the last word of chunk 1 left out: no MAGIC
    assert sink.tolist() == [SENTINEL] * 8
    prefetch_l2(w2, 2 * PREFETCH_WORDS * 4, sink)  # now it is read
    assert sink[1].item() == MAGIC


def test_any_dtype_clipped_to_the_tensor_and_bad_arguments() -> None:
    w = _words_with_magic_xor(2, 1).view(torch.float8_e4m3fn)  # bytes of any dtype
    sink = _sink(4)
    prefetch_l2(w, 10 * w.numel(), sink)  # more than the tensor: clipped to it
    assert sink.tolist() == [SENTINEL, MAGIC, SENTINEL, SENTINEL]
    odd = torch.cat([w, w[:3]])  # a size that is not a multiple of 4 bytes: the whole words only
    sink = _sink(4)
    prefetch_l2(odd, odd.numel(), sink)
    assert sink[1].item() == MAGIC
    prefetch_l2(w, 0, torch.empty(0, dtype=torch.int32, device=DEVICE))  # nothing to do, no sink needed
    with pytest.raises(ValueError, match="sink"):
        prefetch_l2(w, w.numel(), torch.zeros(1, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous"):
        prefetch_l2(w.view(2, -1)[:, ::2], 64, sink)
    with pytest.raises(ValueError, match="4-byte boundary"):
        prefetch_l2(w[1:], 64, sink)
