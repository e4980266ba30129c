"""`TPGroup`: one worker rank's view of its tensor-parallel group (rank, size, collectives).

The group is created once per worker process with torch.distributed over a FileStore in the
server's private ipc directory (removed with it): gloo on CPU, NCCL on CUDA. The launcher starts
the NCCL ranks with NCCL_NVLS_ENABLE=0 (NVLink multicast stays off; `config.worker_env`).
torch.distributed keeps the default process group in module state; `TPGroup` is the only object
that touches it, and the model gets the group explicitly (no global lookup in a layer).

Collectives are in place and issued on the current stream, so a CUDA graph captured over a
decode pass records them too (NCCL >= 2.9.6 supports capture). That path was not run: this
repository has had no multi-GPU machine (docs/tensor_parallel.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class TPGroup:
    """A rank of a tensor-parallel group of `size` ranks (0 <= rank < size, size >= 2).

    `group` is the torch.distributed process group (None: the default one). Every rank must call
    each collective in the same order with tensors of the same shape and dtype.
    """

    rank: int
    size: int
    group: dist.ProcessGroup | None = None

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks in place (every rank ends with the same bytes); returns `x`."""
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """[B, n] on each rank -> [B, size * n], rank r's columns at [r * n, (r + 1) * n).

        One all-gather into a [size * B, n] buffer, then one copy into the column layout."""
        b, n = x.shape
        out = torch.empty((self.size * b, n), dtype=x.dtype, device=x.device)
        dist.all_gather_single(out, x.contiguous(), group=self.group)
        return out.view(self.size, b, n).permute(1, 0, 2).reshape(b, self.size * n)

    def min_int(self, value: int) -> int:
        """The smallest `value` over the ranks (used for the KV pool size: every rank must hold the
        same pages, so the pool is the size the tightest rank can afford)."""
        t = torch.tensor([value], dtype=torch.int64, device=self._device())
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def _device(self) -> torch.device:
        if dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def init_tp_group(rank: int, size: int, store_path: Path | str, device_type: str) -> TPGroup:
    """Join the group of `size` ranks as `rank` (blocks until every rank has joined).

    store_path: a file all ranks can reach that does not exist yet (FileStore rendezvous).
    device_type "cuda": NCCL, and this process's current device becomes cuda:<rank> (one GPU per
    rank, ranks on one host); "cpu": gloo.

    Raises:
        ValueError: rank outside [0, size) or size < 2.
    """
    if not 0 <= rank < size or size < 2:
        raise ValueError(f"tensor-parallel rank {rank} of {size}: need 0 <= rank < size and size >= 2")
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if device_type == "cuda" else "gloo"
    store = dist.FileStore(str(store_path), size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size)
    return TPGroup(rank=rank, size=size)


def destroy_tp_group() -> None:
    """Leave the group (idempotent); a worker calls this on a clean shutdown."""
    if dist.is_initialized():
        dist.destroy_process_group()
