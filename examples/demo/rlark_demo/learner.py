"""The demo's learner: the policy's owner, served over HTTP to the rollouts.

Run as ``python3 -m rlark_demo.learner`` in an rlark task (the demo's ``learner``, on
cluster ``cloud``). It listens on ``$DEMO_LEARNER_HOST:$DEMO_LEARNER_PORT`` (default
``0.0.0.0:8000``: every address of the replica's network namespace in its Domain):

- ``GET /work?replica=R``: the next candidate to evaluate,
  ``{"iteration": k, "candidate": i, "target": [...6 radians]}``; ``{"wait": s}`` while
  every candidate of the iteration is out; ``{"done": true}`` after the last iteration.
  A candidate handed out more than ``REASSIGN_AFTER`` seconds ago without a result goes
  out again (its rollout may have died).
- ``POST /result``: ``{"iteration": k, "candidate": i, "return": r, "replica": R}``;
  a result for another iteration, or a repeated one, is ignored.
- ``GET /policy``: the current mean and std and the curve so far.

When every candidate of an iteration has its return, the policy is refitted
(``rlark_demo.cem``) and one report ``{iteration, reward: mean return, best}`` goes to the
control plane (``rlark reports task/demo-train-learner``). After ``DEMO_ITERATIONS``
iterations it answers ``done`` until every rollout that took work has seen it (at most
``DONE_GRACE`` seconds), prints the curve and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import numpy as np
import rlark

from .cem import CrossEntropy

REASSIGN_AFTER = 10.0
DONE_GRACE = 15.0


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        sys.exit(f"learner: {name}={text!r} is not an integer")


class Learner:
    """The cross-entropy loop's state; every method runs under ``lock``."""

    def __init__(self, iterations: int, population: int, elite: int, seed: int) -> None:
        self.lock = threading.Lock()
        self.iterations = iterations
        self.cem = CrossEntropy(population=population, elite=elite, seed=seed)
        self.iteration = 1
        self.curve: list[tuple[int, float, float]] = []
        self.workers: set[str] = set()
        self.told_done: set[str] = set()
        self.finished = threading.Event()
        self._new_iteration()

    def _new_iteration(self) -> None:
        self.candidates = self.cem.sample()
        self.returns: dict[int, float] = {}
        self.handed_out: dict[int, float] = {}

    @property
    def done(self) -> bool:
        return self.iteration > self.iterations

    def work(self, replica: str) -> dict:
        with self.lock:
            self.workers.add(replica)
            if self.done:
                self.told_done.add(replica)
                if self.told_done >= self.workers:
                    self.finished.set()
                return {"done": True}
            now = time.monotonic()
            for i in range(len(self.candidates)):
                if i in self.returns:
                    continue
                given = self.handed_out.get(i)
                if given is None or now - given > REASSIGN_AFTER:
                    self.handed_out[i] = now
                    return {
                        "iteration": self.iteration,
                        "candidate": i,
                        "target": [round(float(x), 6) for x in self.candidates[i]],
                    }
            return {"wait": 0.05}

    def result(self, body: dict) -> None:
        with self.lock:
            if self.done or body.get("iteration") != self.iteration:
                return
            i = int(body["candidate"])
            if not 0 <= i < len(self.candidates) or i in self.returns:
                return
            self.returns[i] = float(body["return"])
            if len(self.returns) == len(self.candidates):
                self._finish_iteration()

    def _finish_iteration(self) -> None:
        returns = np.array([self.returns[i] for i in range(len(self.candidates))])
        self.cem.update(self.candidates, returns)
        mean, best = float(returns.mean()), float(returns.max())
        self.curve.append((self.iteration, mean, best))
        rlark.report(step=self.iteration, reward=round(mean, 4), best=round(best, 4))
        print(
            f"iteration {self.iteration}/{self.iterations}: mean return {mean:+.3f}, "
            f"best {best:+.3f}, policy std {float(self.cem.std.mean()):.3f}",
            flush=True,
        )
        self.iteration += 1
        if not self.done:
            self._new_iteration()

    def policy(self) -> dict:
        with self.lock:
            return {
                "iteration": self.iteration,
                "mean": self.cem.mean.round(6).tolist(),
                "std": self.cem.std.round(6).tolist(),
                "curve": [{"iteration": k, "reward": m, "best": b} for k, m, b in self.curve],
            }


def serve(learner: Learner, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            url = urlparse(self.path)
            if url.path == "/work":
                replica = parse_qs(url.query).get("replica", ["?"])[0]
                self._send(200, learner.work(replica))
            elif url.path == "/policy":
                self._send(200, learner.policy())
            else:
                self._send(404, {"error": f"no such path {url.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if urlparse(self.path).path != "/result":
                self._send(404, {"error": f"no such path {self.path}"})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                learner.result(body)
            except (ValueError, KeyError, TypeError) as e:
                self._send(400, {"error": f"bad result: {e}"})
                return
            self._send(200, {"ok": True})

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per request would drown the curve

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    host = os.environ.get("DEMO_LEARNER_HOST") or "0.0.0.0"
    port = _env_int("DEMO_LEARNER_PORT", 8000)
    learner = Learner(
        iterations=_env_int("DEMO_ITERATIONS", 8),
        population=_env_int("DEMO_POPULATION", 10),
        elite=_env_int("DEMO_ELITE", 3),
        seed=_env_int("DEMO_SEED", 0),
    )
    server = serve(learner, host, port)
    me = rlark.task()
    where = f"{me.cluster_id}" if me else "outside rlark"
    print(
        f"learner on {where}: serving the policy on {host}:{port}, "
        f"{learner.iterations} iterations of {learner.cem.population} episodes",
        flush=True,
    )
    while not learner.done:
        time.sleep(0.1)
    # Let every rollout hear "done" so that it stops its arm and exits 0.
    learner.finished.wait(DONE_GRACE)
    server.shutdown()
    print("reward curve (mean return per iteration):", flush=True)
    for k, mean, best in learner.curve:
        print(f"  {k:3d} {mean:+.3f} (best {best:+.3f})", flush=True)
    rlark.flush(10)


if __name__ == "__main__":
    main()
