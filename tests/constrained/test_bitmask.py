"""apply_token_bitmask against a plain reference: allowed logits unchanged (bit for bit), the rest
-inf, only in the given rows; LM-head padding columns masked; xgrammar and torch backends agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixrt.constrained import allocate_bitmask, apply_token_bitmask, bitmask_width


def _random_bitmask(rows: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    allowed = rng.random((rows, bitmask_width(vocab) * 32)) < 0.3
    allowed[:, 31::32] = rng.random((rows, bitmask_width(vocab))) < 0.5  # exercise the sign bit
    return np.packbits(allowed, axis=1, bitorder="little").view(np.int32).copy(), allowed


def _reference(logits: torch.Tensor, allowed: np.ndarray, rows: list[int], covered: int) -> torch.Tensor:
    out = logits.clone()
    for r, row in enumerate(rows):
        keep = torch.zeros(logits.shape[1], dtype=torch.bool)
        keep[:covered] = torch.from_numpy(allowed[r, :covered])
        out[row, ~keep] = float("-inf")
    return out


@pytest.mark.parametrize("backend", ["auto", "xgrammar", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch, rows, vocab, logits_width", [
    (4, [0, 1, 2, 3], 100, 100),     # all rows, vocab not a multiple of 32
    (5, [3, 0], 96, 96),             # a subset, out of order
    (3, [1], 70, 128),               # logits wider than the vocab (padded LM head)
    (2, [0, 1], 200, 150),           # bitmask wider than the logits
    (6, [], 64, 64),                 # nothing constrained
])
def test_masking_matches_reference(backend: str, dtype: torch.dtype, batch: int, rows: list[int],
                                   vocab: int, logits_width: int) -> None:
    torch.manual_seed(0)
    logits = torch.randn(batch, logits_width).to(dtype)
    bitmask, allowed = _random_bitmask(len(rows), vocab, seed=batch)
    expected = _reference(logits, allowed, rows, min(vocab, logits_width))
    apply_token_bitmask(logits, bitmask, rows, vocab_size=vocab, backend=backend)
    assert torch.equal(logits, expected)
    untouched = [r for r in range(batch) if r not in rows]
    assert not torch.isinf(logits[untouched]).any()


def test_default_rows_and_torch_bitmask_input() -> None:
    logits = torch.randn(2, 64)
    bitmask = allocate_bitmask(2, 64)
    bitmask[0, 0] = 0b101  # row 0: tokens 0 and 2 in the first word, all of the second
    expected = logits.clone()
    expected[0, [i for i in range(32) if i not in (0, 2)]] = float("-inf")
    apply_token_bitmask(logits, torch.from_numpy(bitmask))
    assert torch.equal(logits, expected)


def test_shape_and_dtype_errors() -> None:
    with pytest.raises(ValueError, match="int32"):
        apply_token_bitmask(torch.zeros(1, 32), np.zeros((1, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="rows"):
        apply_token_bitmask(torch.zeros(1, 32), allocate_bitmask(2, 32))
    with pytest.raises(ValueError, match="entries"):
        apply_token_bitmask(torch.zeros(3, 32), allocate_bitmask(2, 32), [0])
    with pytest.raises(ValueError, match="float"):
        apply_token_bitmask(torch.zeros(1, 32, dtype=torch.int64), allocate_bitmask(1, 32))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["xgrammar", "torch"])
def test_masking_on_cuda_matches_cpu(backend: str) -> None:
    torch.manual_seed(0)
    logits = torch.randn(8, 49216)
    bitmask, _ = _random_bitmask(3, 49152, seed=1)
    rows = [5, 0, 7]
    cpu = logits.clone()
    apply_token_bitmask(cpu, bitmask, rows, vocab_size=49152, backend="torch")
    gpu = logits.cuda()
    apply_token_bitmask(gpu, torch.from_numpy(bitmask).pin_memory(), rows, vocab_size=49152, backend=backend)
    assert torch.equal(gpu.cpu(), cpu)
