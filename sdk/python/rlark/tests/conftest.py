"""A real `rlark up` (the binary `cargo test` built) for the tests that need the control
plane, and a scripted HTTP stand-in for the tests of the reporter's retry rules.

The binary is $RLARK_BIN, else $CARGO_TARGET_DIR/debug/rlark, else target/debug/rlark of
this repo.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parent.parent
REPO = SDK.parent.parent.parent


def rlark_binary() -> Path:
    if os.environ.get("RLARK_BIN"):
        path = Path(os.environ["RLARK_BIN"])
    elif os.environ.get("CARGO_TARGET_DIR"):
        path = Path(os.environ["CARGO_TARGET_DIR"]) / "debug" / "rlark"
    else:
        path = REPO / "target" / "debug" / "rlark"
    if not path.is_file():
        pytest.fail(f"rlark binary not found at {path}: run `cargo build -p rlark` or set RLARK_BIN")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Up:
    """A running `rlark up`: its binary, data directory and admin kubeconfig."""

    binary: Path
    data_dir: Path
    log: Path
    process: subprocess.Popen[bytes]

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "admin.kubeconfig"

    def rlark(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        result = subprocess.run(
            [str(self.binary), *args], env=env, capture_output=True, text=True, timeout=60
        )
        if check and result.returncode != 0:
            pytest.fail(f"rlark {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="session")
def up() -> Iterator[Up]:
    binary = rlark_binary()
    work = Path(tempfile.mkdtemp(prefix="rlark-sdk-"))
    log = work / "up.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(binary), "up", "--data-dir", str(work / "data"),
             "--listen", f"127.0.0.1:{free_port()}"],
            stdout=out, stderr=subprocess.STDOUT, cwd=work,
        )
    running = Up(binary, work / "data", log, process)
    deadline = time.monotonic() + 60
    while "Press Ctrl-C to stop." not in running.output():
        if process.poll() is not None:
            pytest.fail(f"rlark up exited with {process.returncode}:\n{running.output()}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"rlark up did not come up in 60 s:\n{running.output()}")
        time.sleep(0.1)
    try:
        yield running
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(work, ignore_errors=True)


def wait_for(what: str, check, seconds: float = 60.0):  # type: ignore[no-untyped-def]
    """Poll `check()` until it returns something truthy; fail naming `what` otherwise."""
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}; last: {last!r}")


@dataclass
class Stub:
    """An HTTP server answering POSTs from a script of (status, headers) answers, then 201;
    it records the bodies of the answers it gave 201."""

    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    stored: list[dict[str, object]] = field(default_factory=list)
    requests: int = 0
    hang: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""


@pytest.fixture
def stub() -> Iterator[Stub]:
    state = Stub()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            while state.hang.is_set():
                time.sleep(0.05)
            with state.lock:
                state.requests += 1
                status, headers = state.script.pop(0) if state.script else (201, {})
                if status == 201:
                    state.stored.append(json.loads(body))
            reply = json.dumps({"kind": "Status", "message": f"scripted {status}"}).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/reports"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.hang.clear()
        server.shutdown()
        server.server_close()
