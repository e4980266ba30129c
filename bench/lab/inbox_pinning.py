"""How much memory one never-read request keeps in the front end (tokenizer process), with and without
the Inbox's detaching of pending chunks (tokenizer_proc/manager.py `_DETACH_EVERY`; docs/memory.md,
"Host memory of the front end").

    python bench/lab/inbox_pinning.py [--passes 1024] [--requests 256] [--top-logprobs 20]   # CPU, ~10 s

Each pass is a TokenOutBatch of `--requests` requests with one token and top-k logprobs each, sent
through protocol.encode / decode as on the socket (its arrays are views of the frames) and split by
TokenizerManager._dispatch; request r0's Inbox is never read. Prints the memory tracemalloc sees held
after all passes, with detaching (every _DETACH_EVERY chunks) and without (a threshold never reached).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixrt import protocol  # noqa: E402
from radixrt.ipc import IpcAddresses  # noqa: E402
from radixrt.tokenizer_proc import manager as M  # noqa: E402


def token_pass(n: int, k: int, rng: np.random.Generator) -> protocol.TokenOutBatch:
    """A one-token-per-request batch of `n` requests r0..r{n-1} with top-`k` logprobs, through encode /
    decode like the real socket (its arrays are views of the received frames)."""
    frames = protocol.encode(protocol.TokenOutBatch(
        rids=[f"r{i}" for i in range(n)], top_logprobs_nums=[k] * n,
        offsets=np.arange(n + 1, dtype=np.int32), output_ids=rng.integers(0, 999, n, dtype=np.int32),
        logprobs=-rng.random(n, dtype=np.float32),
        top_logprob_ids=rng.integers(0, 999, n * k, dtype=np.int32),
        top_logprobs=-rng.random(n * k, dtype=np.float32), finish_reasons=[None] * n,
        matched_stop=[None] * n, prompt_tokens=[4] * n, completion_tokens=[1] * n, cached_tokens=[0] * n,
        errors=[None] * n))
    return protocol.decode([bytes(f) for f in frames], (protocol.TokenOutBatch,))


def held_mib(detach_every: int, passes: int, requests: int, k: int) -> float:
    """MiB held by one unread request's Inbox (and what it keeps alive) after `passes` passes."""
    saved, M._DETACH_EVERY = M._DETACH_EVERY, detach_every
    try:
        m = M.TokenizerManager(IpcAddresses(*["x"] * 6), max_inflight=8)
        m._queues["r0"] = M.Inbox()
        rng = np.random.default_rng(0)
        tracemalloc.start()
        for _ in range(passes):
            m._dispatch(token_pass(requests, k, rng))
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return held / 2**20
    finally:
        M._DETACH_EVERY = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=1024)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--top-logprobs", type=int, default=20)
    a = ap.parse_args()
    on = held_mib(M._DETACH_EVERY, a.passes, a.requests, a.top_logprobs)
    off = held_mib(1 << 62, a.passes, a.requests, a.top_logprobs)
    print(f"{a.passes} passes of {a.requests} requests, top_logprobs {a.top_logprobs}, one request unread:")
    print(f"  detached every {M._DETACH_EVERY} chunks: {on:.1f} MiB held; never detached: {off:.1f} MiB")


if __name__ == "__main__":
    main()
