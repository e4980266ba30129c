"""Time to answer a short request sent while a long prompt is being prefilled (chunked prefill).

    python bench/short_during_long.py                                  # default flags
    python bench/short_during_long.py --server-flags "--chunked-prefill-size 4096"

Starts a server on the default model (or --model-path), sends a `--long-len`-token completion
(max_tokens 2), waits `--delay-s`, then sends the prompt "Hi" with max_tokens 1, and prints the
second request's latency in seconds.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.server_proc import start_server  # noqa: E402
from radixrt.config import Env  # noqa: E402
from radixrt.models.loader import resolve_model_dir  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=None)
    p.add_argument("--server-flags", default="")
    p.add_argument("--long-len", type=int, default=3000)
    p.add_argument("--delay-s", type=float, default=1.5)
    ns = p.parse_args(argv)
    model_dir = resolve_model_dir(ns.model_path, Env.read().cache_dir, "auto")
    server = start_server(model_dir, Path(tempfile.mkdtemp()), *shlex.split(ns.server_flags))
    try:
        model = httpx.get(server.base_url + "/v1/models").json()["data"][0]["id"]
        long_body = {"model": model, "prompt": list(range(1000, 1000 + ns.long_len)), "max_tokens": 2}
        t = threading.Thread(target=lambda: httpx.post(server.base_url + "/v1/completions", json=long_body,
                                                       timeout=600))
        t.start()
        time.sleep(ns.delay_s)
        t0 = time.perf_counter()
        r = httpx.post(server.base_url + "/v1/completions",
                       json={"model": model, "prompt": "Hi", "max_tokens": 1},
                       timeout=600)
        latency = time.perf_counter() - t0
        t.join()
        print(f"short request during a {ns.long_len}-token prefill: {latency:.2f} s (HTTP {r.status_code})")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
