"""Start a real `rlark server` (the binary `cargo test` built) for the official Python client."""

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import ssl

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rlark_binary():
    path = os.environ.get("RLARK_BIN") or os.path.join(ROOT, "target", "debug", "rlark")
    if not os.path.exists(path):
        pytest.fail(f"rlark binary not found at {path}: run `cargo build` or set RLARK_BIN")
    return path


@pytest.fixture(scope="session")
def rlark_server():
    """Yields the path of the admin kubeconfig of a freshly started server."""
    data_dir = tempfile.mkdtemp(prefix="rlark-pytest-")
    log = open(os.path.join(data_dir, "server.log"), "wb")
    proc = subprocess.Popen(
        # API conformance only: without the controllers no status write of theirs lands in
        # the middle of a watched sequence (a Job's status update is a MODIFIED event too).
        [
            rlark_binary(),
            "server",
            "--data-dir",
            data_dir,
            "--listen",
            "127.0.0.1:0",
            "--controllers=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    kubeconfig = os.path.join(data_dir, "admin.kubeconfig")
    deadline = time.time() + 60
    while not os.path.exists(kubeconfig):
        if proc.poll() is not None or time.time() > deadline:
            log.flush()
            output = open(os.path.join(data_dir, "server.log"), "rb").read().decode(errors="replace")
            proc.kill()
            pytest.fail(f"rlark server did not start (exit {proc.poll()}):\n{output}")
        time.sleep(0.1)
    try:
        yield kubeconfig
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)
