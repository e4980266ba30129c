"""The model gateway in front of a fleet: one `smg launch --enable-igw` process and its control plane.

smg (Shepherd Model Gateway, the SGLang model gateway spun out; `pip install radixrt[fleet]`) routes
each request by its `model` to a worker serving that name, picks the replica with its policy
(the fleet's default: cache_aware, see DEFAULT_POLICY), health-checks the
workers and checks one API key on the data plane (`--api-key`). In IGW (multi-model) mode
`--worker-urls` is ignored: workers are added with `POST /workers` and removed with
`DELETE /workers/{id}`, both under the same key. smg forwards the client's `Authorization` header to
the worker, and sends the registered `api_key` on its own probes, so gateway and workers share one key.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("radixrt.fleet")

# The fleet's default policy for the replicas of a model: smg's cache_aware (an approximate radix
# tree of the text sent to each worker). prefix_hash over PREFIX_HASH_TOKENS tokens' worth of text
# (smg hashes 4 characters per token of an untokenized request, so 256 characters; for chat the
# messages' text joined by spaces, system prompt first) is the alternative for many distinct system
# prompts; `--prefix-token-count` is always passed so that choosing it needs no other flag. Measured
# (bench/results/fleet.md):
# - simulation (bench/lab/fleet_routing_sim.py, 32 system prompts x 16 questions, c64): prefix_hash-64
#   hit 0.94 (= one server's) in 9 runs of 12, 0.76-0.90 when the hash ring put 19-22 of the 32
#   prompts on one worker; cache_aware 0.52-0.59 in 5 of 6 (a burst of new prefixes goes to one
#   worker by a load figure the burst does not move; once its balance gate spills a prefix, two
#   workers hold it and share its requests);
# - one H200, two replicas, 2,048-token prompts (2026-12-01): prefix_hash-64 0.63 / 0.67 over two
#   rounds (162 / 350 requests: the ring's split), cache_aware 0.71 / 0.54, round_robin 0.68 / 0.56;
# - every request starting with the same long text (one agent's system prompt under every
#   conversation, this project's users): prefix_hash puts all of them on one replica (sim: hit 0.48,
#   125 / 387 requests), cache_aware 0.74-0.94, because the shared text matches on both replicas and
#   each conversation's own text on one.
# Neither meets the goals on the GPU; cache_aware is kept as the default for the last case.
DEFAULT_POLICY = "cache_aware"
PREFIX_HASH_TOKENS = 64
HEALTH_CHECK_INTERVAL_S = 5  # smg's default is 60 s: a dead worker would keep receiving requests
SHUTDOWN_GRACE_S = 2  # smg waits this long for in-flight requests on SIGTERM (its default: 180 s)
STOP_TIMEOUT_S = 10.0


def free_port(host: str) -> int:
    """A TCP port of `host` that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def smg_available() -> bool:
    """Whether the `smg` package (the gateway) is installed in this interpreter."""
    return importlib.util.find_spec("smg") is not None


@dataclass
class Gateway:
    """One smg process in IGW mode on host:port; `stop` ends it (SIGTERM, then SIGKILL).

    The key is passed on smg's command line (as radixrt's own --api-key is): visible to local users
    through the process list.
    """

    host: str
    port: int
    api_key: str
    policy: str
    log_path: Path
    extra_args: tuple[str, ...] = ()
    proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def command(self) -> list[str]:
        """`smg launch` in IGW mode; its Prometheus listener (smg's default: 0.0.0.0:29000, which a
        second gateway could not bind) on a free port of `host`; prefix_hash's span PREFIX_HASH_TOKENS
        (whatever `policy` is: a model's own policy label may pick prefix_hash). extra_args come last
        and win."""
        return [sys.executable, "-m", "smg", "launch", "--enable-igw", "--host", self.host,
                "--port", str(self.port), "--api-key", self.api_key, "--policy", self.policy,
                "--prefix-token-count", str(PREFIX_HASH_TOKENS),
                "--health-check-interval-secs", str(HEALTH_CHECK_INTERVAL_S),
                "--shutdown-grace-period-secs", str(SHUTDOWN_GRACE_S), "--log-level", "warn",
                "--prometheus-host", self.host, "--prometheus-port", str(free_port(self.host)),
                *self.extra_args]

    def start(self, timeout_s: float = 60.0) -> None:
        """Start smg and wait until it answers /health. Raises RuntimeError if it exits or times out."""
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"smg exited with {self.proc.returncode} (log: {self.log_path})")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"smg did not answer /health within {timeout_s:.0f} s (log: {self.log_path})")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def register(self, url: str, policy: str | None = None) -> str:
        """Add the worker at `url` (its model id comes from its /server_info and /v1/models); returns
        smg's worker id. `policy` sets the routing policy of the worker's model (smg's `policy`
        label; the first worker of a model decides). Raises httpx.HTTPError on refusal."""
        body: dict[str, Any] = {"url": url, "api_key": self.api_key}
        if policy:
            body["labels"] = {"policy": policy}
        r = httpx.post(f"{self.base_url}/workers", json=body, headers=self.headers, timeout=10.0)
        r.raise_for_status()
        return str(r.json()["worker_id"])

    def deregister(self, worker_id: str) -> None:
        """Remove a worker (queued by smg); a worker smg no longer knows is not an error."""
        try:
            httpx.delete(f"{self.base_url}/workers/{worker_id}", headers=self.headers, timeout=10.0)
        except httpx.HTTPError as e:
            log.warning("could not deregister worker %s: %s", worker_id, e)

    def workers(self) -> dict[str, dict[str, Any]]:
        """smg's view of its workers by URL (`is_healthy`, `status`, `model_id`, ...); {} on error."""
        try:
            r = httpx.get(f"{self.base_url}/workers", headers=self.headers, timeout=5.0)
            r.raise_for_status()
            return {w["url"]: w for w in r.json().get("workers", [])}
        except (httpx.HTTPError, ValueError, KeyError):
            return {}

    def wait_healthy(self, urls: set[str], timeout_s: float) -> None:
        """Block until smg reports every worker in `urls` healthy and ready.

        Raises:
            RuntimeError: not within `timeout_s`, or smg exited.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            seen = self.workers()
            ready = {u for u, w in seen.items() if w.get("is_healthy") and w.get("status") == "ready"}
            if urls <= ready:
                return
            if time.monotonic() > deadline or not self.alive():
                raise RuntimeError(f"the gateway did not report {sorted(urls - ready)} healthy")
            time.sleep(0.3)

    def stop(self) -> None:
        """SIGTERM smg's process group, SIGKILL it after STOP_TIMEOUT_S."""
        if self.proc is None or self.proc.poll() is not None:
            return
        stop_process_group(self.proc, STOP_TIMEOUT_S)


def stop_process_group(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM the group led by `proc` (started with start_new_session), SIGKILL it after `timeout_s`."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        proc.wait()
        return
    try:
        proc.wait(timeout=timeout_s)
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the leader is not reaped yet: the group id is still its own
    except ProcessLookupError:
        pass
    proc.wait()
