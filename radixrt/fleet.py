"""`radixrt launch-fleet`: several models and replicas behind one gateway, one base URL and one key.

The fleet starts the gateway (radixrt/gateway.py: smg in IGW mode) and one `radixrt launch-server`
per replica (own port, own session, CUDA_VISIBLE_DEVICES from the config), waits until every worker
answers /health, registers each with the gateway (`POST /workers`) and waits until the gateway
reports them all healthy. Then it supervises:

- a worker that exits is deregistered at once (so the gateway stops sending it requests before its
  own health check notices) and restarted on the same port after a back-off of
  1, 2, 4, ... up to 60 s (consecutive failures; reset once a worker has stayed up 60 s), then
  registered again when its /health answers;
- a gateway that exits is restarted the same way and every healthy worker is registered again;
- SIGTERM/SIGINT stop everything: every worker and the gateway get SIGTERM together, SIGKILL after
  STOP_TIMEOUT_S; the command exits 0. A failure while starting exits 1; a bad config exits 2.

The fleet's view is written to `<log-dir>/state.json` on every change (tests and operators read it).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from radixrt.fleet_config import FleetConfig, ModelSpec
from radixrt.gateway import Gateway, free_port, stop_process_group

log = logging.getLogger("radixrt.fleet")

READY_TIMEOUT_S = 900.0  # a worker that is not healthy this long after a start is killed
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
STABLE_S = 60.0  # up this long: the failure count starts again from zero
STOP_TIMEOUT_S = 15.0  # radixrt's launcher stops its children within 5 s of SIGTERM
POLL_S = 0.5


class _Stop(Exception):
    """Raised from the signal handler to leave the supervision loop."""


def backoff_s(failures: int) -> float:
    """Delay before restart number `failures` (>= 1) in a row: 1, 2, 4, ... capped at BACKOFF_MAX_S."""
    return min(BACKOFF_BASE_S * 2 ** max(failures - 1, 0), BACKOFF_MAX_S)


@dataclass
class Worker:
    """One replica: a `radixrt launch-server` process on a fixed port, and its gateway registration.

    state: "starting" (process up, /health not yet 200), "healthy" (registered), "backoff" (dead,
    restart due at `restart_at`).
    """

    model: ModelSpec
    replica: int
    host: str
    port: int
    log_path: Path
    proc: subprocess.Popen | None = None
    worker_id: str | None = None  # smg's id while registered
    state: str = "backoff"
    started_at: float = 0.0
    restart_at: float = 0.0
    failures: int = 0
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def label(self) -> str:
        return f"{self.model.name}[{self.replica}]"

    def command(self, api_key: str) -> list[str]:
        cmd = [sys.executable, "-m", "radixrt.cli", "launch-server", "--host", self.host,
               "--port", str(self.port), "--api-key", api_key, "--served-model-name", self.model.name]
        if self.model.model_path:
            cmd += ["--model-path", self.model.model_path]
        return cmd + list(self.model.args)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.model.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.model.gpus[self.replica]
        return env

    def spawn(self, api_key: str) -> None:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.command(api_key), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env(), start_new_session=True)
        self.state, self.started_at, self.worker_id = "starting", time.monotonic(), None
        log.info("%s: started pid %d on %s (log %s)", self.label, self.proc.pid, self.url, self.log_path)

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False


class Fleet:
    """The gateway and every worker of `cfg`; `run` blocks until a signal (see module docstring)."""

    def __init__(self, cfg: FleetConfig) -> None:
        assert cfg.api_key is not None  # FleetConfig checks it
        self.cfg = cfg
        self.api_key: str = cfg.api_key
        self.log_dir = cfg.log_dir or Path(tempfile.mkdtemp(prefix="radixrt-fleet-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.gateway = Gateway(cfg.host, cfg.port, cfg.api_key, cfg.policy, self.log_dir / "gateway.log",
                               tuple(cfg.gateway_args))
        self.gateway_failures, self.gateway_restart_at = 0, 0.0
        self.workers: list[Worker] = []
        for m in cfg.models:
            for i in range(m.replicas):
                port = (cfg.worker_base_port + len(self.workers) if cfg.worker_base_port
                        else free_port(cfg.worker_host))
                self.workers.append(Worker(m, i, cfg.worker_host, port,
                                           self.log_dir / f"worker-{m.name}-{i}.log"))

    # ------------------------------------------------------------------ start-up
    def start(self) -> None:
        """Gateway, then every worker; return once the gateway reports all of them healthy.

        Raises:
            RuntimeError: the gateway or a worker exited or timed out while starting.
        """
        self.gateway.start()
        log.info("gateway (smg) on %s, policy %s", self.gateway.base_url, self.cfg.policy)
        for w in self.workers:
            w.spawn(self.api_key)
        self.write_state()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while any(w.state != "healthy" for w in self.workers):
            if time.monotonic() > deadline:
                raise RuntimeError("timed out waiting for the workers to become healthy")
            for w in self.workers:
                code = w.exit_code()
                if code is not None:
                    raise RuntimeError(f"{w.label} exited with {code} while starting (log: {w.log_path})")
                if w.state == "starting" and w.healthy():
                    self.register(w)
            time.sleep(POLL_S)
        self.gateway.wait_healthy({w.url for w in self.workers}, max(deadline - time.monotonic(), 1.0))

    def register(self, w: Worker) -> None:
        w.worker_id = self.gateway.register(w.url, w.model.policy)
        w.state = "healthy"
        log.info("%s: healthy, registered with the gateway (%s)", w.label, w.worker_id)
        self.write_state()

    # ------------------------------------------------------------------ supervision
    def supervise_once(self, now: float) -> None:
        """One pass: restart what died, register what became healthy (see module docstring)."""
        if not self.gateway.alive() and self.gateway_restart_at == 0.0:
            code = self.gateway.proc.poll() if self.gateway.proc else None
            self.gateway_failures += 1
            self.gateway_restart_at = now + backoff_s(self.gateway_failures)
            log.warning("gateway exited with %s; restarting in %.0f s", code, self.gateway_restart_at - now)
            self.write_state()
        if self.gateway_restart_at and now >= self.gateway_restart_at:
            self.restart_gateway()
        for w in self.workers:
            self.supervise_worker(w, now)

    def supervise_worker(self, w: Worker, now: float) -> None:
        code = w.exit_code()
        if w.state in ("starting", "healthy") and code is not None:
            self.on_worker_exit(w, code, now)
        elif w.state == "starting" and now - w.started_at > READY_TIMEOUT_S:
            log.warning("%s: not healthy after %.0f s; killing it", w.label, READY_TIMEOUT_S)
            assert w.proc is not None
            stop_process_group(w.proc, STOP_TIMEOUT_S)
        elif w.state == "starting" and self.gateway.alive() and w.healthy():
            try:
                self.register(w)
            except httpx.HTTPError as e:
                log.warning("%s: gateway refused the registration (%s); retrying", w.label, e)
        elif w.state == "healthy" and w.failures and now - w.started_at > STABLE_S:
            w.failures = 0
        elif w.state == "backoff" and now >= w.restart_at:
            w.restarts += 1
            w.spawn(self.api_key)
            self.write_state()

    def on_worker_exit(self, w: Worker, code: int, now: float) -> None:
        if w.worker_id is not None and self.gateway.alive():
            self.gateway.deregister(w.worker_id)
        w.failures += 1
        w.state, w.worker_id, w.restart_at = "backoff", None, now + backoff_s(w.failures)
        log.warning("%s: exited with %d; deregistered, restart %d in %.0f s", w.label, code,
                    w.restarts + 1, w.restart_at - now)
        self.write_state()

    def restart_gateway(self) -> None:
        self.gateway_restart_at = 0.0
        try:
            self.gateway.start()
        except RuntimeError as e:
            log.warning("gateway restart failed: %s", e)
            return  # the next pass sees it dead and backs off further
        log.info("gateway restarted; registering the healthy workers again")
        for w in self.workers:
            if w.state == "healthy":
                w.state = "starting"  # registered on the next pass, once /health answers
        self.write_state()

    def run(self) -> None:
        """Supervise until _Stop (a signal)."""
        while True:
            self.supervise_once(time.monotonic())
            time.sleep(POLL_S)

    # ------------------------------------------------------------------ shutdown, state
    def stop(self) -> None:
        """SIGTERM every worker and the gateway together; SIGKILL what is left after STOP_TIMEOUT_S."""
        procs = [w.proc for w in self.workers if w.proc is not None and w.proc.poll() is None]
        if self.gateway.alive():
            assert self.gateway.proc is not None
            procs.append(self.gateway.proc)
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            stop_process_group(p, STOP_TIMEOUT_S)  # already signalled: this waits, then kills
        self.write_state()

    def state(self) -> dict[str, Any]:
        g = self.gateway
        return {"gateway": {"url": g.base_url, "pid": g.proc.pid if g.proc else None, "alive": g.alive(),
                            "log": str(g.log_path)},
                "workers": [{"model": w.model.name, "replica": w.replica, "url": w.url, "state": w.state,
                             "pid": w.proc.pid if w.proc else None, "restarts": w.restarts,
                             "worker_id": w.worker_id, "log": str(w.log_path)} for w in self.workers]}

    def write_state(self) -> None:
        tmp = self.log_dir / "state.json.tmp"
        tmp.write_text(json.dumps(self.state(), indent=1))
        tmp.replace(self.log_dir / "state.json")


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop()


def launch_fleet(cfg: FleetConfig) -> int:
    """Run the fleet until SIGTERM/SIGINT (exit 0); 1 when start-up fails."""
    logging.basicConfig(level="INFO", format="[%(asctime)s fleet] %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health poll otherwise
    fleet = Fleet(cfg)
    old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        fleet.start()
        names = ", ".join(f"{m.name} x{m.replicas}" for m in cfg.models)
        print(f"radixrt fleet: ready on {fleet.gateway.base_url}/v1 ({names}; logs {fleet.log_dir})",
              file=sys.stderr, flush=True)
        fleet.run()
    except _Stop:
        log.info("signal received, stopping the fleet")
    except (RuntimeError, httpx.HTTPError) as e:
        print(f"radixrt fleet: error: {e}", file=sys.stderr, flush=True)
        code = 1
    finally:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
        fleet.stop()
        for s, h in old.items():
            signal.signal(s, h)
    return code
