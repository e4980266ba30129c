"""The layers of a tensor-parallel rank whose outputs need communication (Megatron-LM's
row-parallel linear, vocab-parallel embedding and LM head; Shoeybi et al., 2019).

Column-parallel linears (q|k|v, gate|up) are plain `Linear`s over a rank's rows: their outputs
stay sharded, so they need no collective. Each decoder layer makes exactly two all-reduces (after
o_proj and after down_proj), the embedding one, and the LM head one all-gather. With --tp-size 1
none of these classes is built (models/llama.py builds plain layers), so nothing changes there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixrt.models.linear import Linear
from radixrt.parallel.group import TPGroup


class RowParallelLinear(Linear):
    """A `Linear` over this rank's input columns ([N, K/size] weight): x [T, K/size] -> partial
    [T, N], summed over the ranks in place (one all-reduce). The bias lives on rank 0 only."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPGroup) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce_(super().forward(x))


class VocabParallelEmbedding(nn.Module):
    """This rank's rows [start, start + num_local) of the embedding table ([num_local, H] weight,
    zero rows past the vocab). ids [T] int64 -> [T, H]: a masked lookup (ids outside the slice
    read row 0, then are zeroed), summed over the ranks (one all-reduce of [T, H]).

    Chosen over an all-gather of the table or of per-rank lookups: the all-reduce moves T x H
    values, the same as the decoder's own all-reduces, whatever the vocab size."""

    def __init__(self, num_local: int, hidden: int, start: int, tp: TPGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_local, hidden))
        self.start, self.num_local, self.tp = start, num_local, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.num_local)  # [T] bool
        h = F.embedding(torch.where(inside, local, 0), self.weight)  # [T, H]
        h = h * inside.unsqueeze(-1).to(h.dtype)
        return self.tp.all_reduce_(h)


class ParallelLMHead(Linear):
    """The LM head over this rank's vocab rows ([num_local, H] weight): hidden [B, H] -> logits
    [B, vocab_size], the ranks' [B, num_local] column blocks all-gathered, padding columns (past
    the vocab on the last rank) dropped. Every rank ends with the same full logits, which is what
    lets every rank sample the same tokens (docs/tensor_parallel.md)."""

    def __init__(self, hidden: int, num_local: int, vocab_size: int, tp: TPGroup) -> None:
        super().__init__(hidden, num_local, bias=False)
        self.vocab_size, self.tp = vocab_size, tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_gather_last(super().forward(x))[:, :self.vocab_size]
