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


def _words_with_magic_xor(programs: int, magic_program: int) -> torch.Tensor:
    """int32 words whose xor over program `magic_program`'s chunk is MAGIC (every other chunk's: 0)."""
    w = torch.zeros(programs * PREFETCH_WORDS, dtype=torch.int32)
    w[magic_program * PREFETCH_WORDS + 7] = MAGIC
    return w.to(DEVICE)


def test_reads_the_requested_words_and_writes_only_the_magic_xor() -> None:
    w = _words_with_magic_xor(3, 1)
    sink = torch.zeros(8, dtype=torch.int32, device=DEVICE)
    prefetch_l2(w, w.numel() * 4, sink)
    assert sink.tolist() == [0, MAGIC, 0, 0, 0, 0, 0, 0]  # program 1 saw its word: the loads happen
    sink.zero_()
    prefetch_l2(w, PREFETCH_WORDS * 4 + 28, sink)  # up to word 7 of chunk 1 exclusive: MAGIC not read
    assert prefetch_programs(PREFETCH_WORDS * 4 + 28) == 2 and sink.abs().sum().item() == 0
    prefetch_l2(w, PREFETCH_WORDS * 4 + 32, sink)  # now word 7 of chunk 1 is read
    assert sink[1].item() == MAGIC


def test_any_dtype_clipped_to_the_tensor_and_bad_arguments() -> None:
    w = _words_with_magic_xor(2, 1).view(torch.float8_e4m3fn)  # bytes of any dtype
    sink = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    prefetch_l2(w, 10 * w.numel(), sink)  # more than the tensor: clipped to it
    assert sink[1].item() == MAGIC
    prefetch_l2(w, 0, torch.empty(0, dtype=torch.int32, device=DEVICE))  # nothing to do, no sink needed
    with pytest.raises(ValueError, match="sink"):
        prefetch_l2(w, w.numel(), torch.zeros(1, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous"):
        prefetch_l2(w.view(2, -1)[:, ::2], 64, sink)
    with pytest.raises(ValueError, match="multiple of 4"):
        prefetch_l2(torch.zeros(6, dtype=torch.uint8, device=DEVICE), 4, sink)
