"""The reporter's rules: what it refuses at the call, how it retries, what it drops."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rlark
from conftest import Stub, wait_for


def test_reports_are_checked_as_the_server_checks_them() -> None:
    assert json.loads(rlark.build_report("reward", {"value": 1.5, "step": 3})) == {
        "type": "reward", "value": 1.5, "step": 3}
    for bad, message in [
        (("", {}), "1 to 63 characters"),
        (("x" * 64, {}), "1 to 63 characters"),
        (("m", {"type": "x"}), "cannot be named 'type'"),
        (("m", {"loss": float("nan")}), "loss is nan"),
        (("m", {"deep": {"x": [1, float("inf")]}}), r"deep\.x\[1\] is inf"),
        (("m", {"obj": object()}), "obj is a object, which is not JSON"),
        (("m", {"blob": "x" * 17000}), "at most 16384"),
    ]:
        with pytest.raises(rlark.ReportError, match=message):
            rlark.build_report(*bad)


def test_numpy_values_become_plain_numbers() -> None:
    import numpy  # the `test` extra installs it

    body = json.loads(rlark.build_report("m", {"a": numpy.float32(0.5), "b": numpy.arange(3)}))
    assert body == {"type": "m", "a": 0.5, "b": [0, 1, 2]}


def test_failed_posts_are_retried_in_order_and_sent_once(stub: Stub) -> None:
    stub.script = [(503, {}), (429, {"Retry-After": "0"}), (500, {})]
    reporter = rlark.Reporter(stub.url, "token")
    for step in range(5):
        assert reporter.submit(rlark.build_report("reward", {"step": step}))
    assert reporter.flush(timeout=30)
    assert [r["step"] for r in stub.stored] == [0, 1, 2, 3, 4]
    assert stub.requests == 8
    assert (reporter.sent, reporter.dropped, reporter.pending) == (5, 0, 0)
    reporter.close()


def test_a_refused_report_is_dropped_with_the_servers_message(
    stub: Stub, caplog: pytest.LogCaptureFixture
) -> None:
    stub.script = [(400, {})]
    reporter = rlark.Reporter(stub.url, "token")
    with caplog.at_level(logging.WARNING, logger="rlark"):
        reporter.submit(rlark.build_report("a", {}))
        reporter.submit(rlark.build_report("b", {}))
        assert reporter.flush(timeout=30)
    assert [r["type"] for r in stub.stored] == ["b"]
    assert (reporter.sent, reporter.dropped) == (1, 1)
    assert "the server refused a report with 400: scripted 400" in caplog.text
    reporter.close()


def test_reporting_never_blocks_on_a_hung_server(stub: Stub) -> None:
    stub.hang.set()
    reporter = rlark.Reporter(stub.url, "token", max_pending=10, timeout=60)
    accepted = [reporter.submit(rlark.build_report("m", {"i": i})) for i in range(15)]
    # Every call returned although the server answers nothing; beyond the bound they drop.
    assert accepted == [True] * 10 + [False] * 5
    assert reporter.dropped == 5 and reporter.pending == 10
    assert reporter.flush(timeout=0.2) is False
    stub.hang.clear()
    assert reporter.flush(timeout=30)
    assert [r["i"] for r in stub.stored] == list(range(10))
    reporter.close()


def test_close_drops_what_cannot_be_sent_and_says_so(
    stub: Stub, caplog: pytest.LogCaptureFixture
) -> None:
    stub.script = [(503, {"Retry-After": "30"})]
    reporter = rlark.Reporter(stub.url, "token")
    reporter.submit(rlark.build_report("m", {}))
    reporter.submit(rlark.build_report("m", {}))
    wait_for("the first post", lambda: stub.requests >= 1)
    with caplog.at_level(logging.WARNING, logger="rlark"):
        assert reporter.close(timeout=0.1) is False
    assert "2 reports were not sent before exit" in caplog.text
    assert reporter.dropped == 2
    assert reporter.submit(rlark.build_report("m", {})) is False


def test_a_bad_url_is_refused() -> None:
    with pytest.raises(ValueError, match="is not an http"):
        rlark.Reporter("ftp://x/reports", "t")


def test_outside_a_task_report_is_a_no_op_with_one_warning() -> None:
    script = (
        "import warnings, rlark\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    rlark.report(step=1, reward=0.5)\n"
        "    rlark.event('checkpoint', path='/x')\n"
        "    assert rlark.flush(1)\n"
        "print(len(seen), seen[0].message)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLARK_")}
    env["PYTHONPATH"] = _sdk_path()
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.startswith("1 rlark: RLARK_REPORT_URL is not set"), out


def _sdk_path() -> str:
    return str(Path(rlark.__file__).resolve().parent.parent)
