"""Programmatic dependent launch (PDL) for the decode path's kernels on Hopper and newer GPUs.

A kernel launched with PDL (CUDA's programmatic stream serialization; Triton's `launch_pdl=True`) may
start while the kernel before it in the stream is still running: its programs are scheduled once every
program of the previous kernel has called `griddepcontrol.launch_dependents` (or exited), and each of
them waits in `griddepcontrol.wait` until the previous kernel has finished and its memory writes are
visible (CUDA C++ Programming Guide, "Programmatic Dependent Launch and Synchronization"; Triton's
tutorial 11). What overlaps is the next kernel's launch, its programs' start-up, and whatever it reads
that no earlier kernel writes (weights, norm scales) before its wait: at batch-1 decode, ~10 short
kernels per layer each pay that latency in full without it.

The contract every kernel with a `USE_PDL` constexpr keeps (see `gdc_enter`):
  - before `gdc_wait`: loads of tensors no kernel of the forward pass writes (weights, their scales,
    norm weights) and address arithmetic only; no store, no atomic, no load of activations,
    metadata or the KV pool;
  - `gdc_wait` then `gdc_launch_dependents`: the next kernel's programs may be scheduled from here on
    (they wait for this one's completion before touching anything this one writes), so the chain of
    waits orders every kernel after all of its predecessors.
A kernel without the constexpr is launched the ordinary way (it starts after its predecessor has
finished), so the two kinds mix freely in one stream or CUDA graph (stream capture records the
programmatic edges). `RADIXRT_PDL=0` turns PDL off; it is off on pre-Hopper GPUs, under
TRITON_INTERPRET and on CPU tensors.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import switches

# Read at every launch (kernel launchers call use_pdl), so a test or a bench can switch PDL off and on
# in one process; CUDA graphs keep the setting they were captured with.
enabled = switches.pdl_enabled()


@functools.cache
def _capable(device_index: int) -> bool:
    if switches.interpreting():
        return False
    if not hasattr(tl.extra.cuda, "gdc_wait") or not hasattr(tl.extra.cuda, "gdc_launch_dependents"):
        return False
    if torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def use_pdl(t: torch.Tensor) -> bool:
    """True when kernels launched on `t`'s device should use PDL (a CUDA device of compute capability
    >= 9.0, `enabled` (RADIXRT_PDL not 0), not the Triton interpreter). Never raises."""
    if not enabled or not t.is_cuda:
        return False
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return _capable(index)


def launch_options(pdl: bool) -> dict:
    """The launch keyword arguments for a kernel compiled with USE_PDL=pdl: {"launch_pdl": True} or
    {} (the interpreter and older Tritons know no such option)."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def gdc_enter(USE_PDL: tl.constexpr):
    """Wait for the previous kernel in the stream (its writes are then visible), then let the next
    PDL-launched kernel's programs be scheduled. A no-op when USE_PDL is False."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
