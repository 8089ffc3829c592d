"""Task reports posted to the control plane from a background thread, so that reporting
never blocks the training loop (docs/tasks.md, "Task reports"; sdk/python/rlark/README.md).

The API takes one report per request (``POST RLARK_REPORT_URL``, bearer ``RLARK_TOKEN``,
TLS verified against ``RLARK_CA_FILE``). A :class:`Reporter` queues reports and a daemon
thread sends them in order, back to back on one kept-alive connection:

- 201: sent; the next one follows at once;
- 429 (the task's write-rate bucket is empty) and 5xx, or a connection error: the same
  report is sent again after ``Retry-After`` or a backoff doubling from 0.2 s to 10 s, so
  reports are neither lost nor reordered while the server is away;
- any other answer (400, 403, 404, 413: retrying cannot change it): the report is dropped
  and the server's message logged at WARNING on the ``rlark`` logger.

The queue holds at most ``max_pending`` reports; beyond that new reports are dropped and
counted (:attr:`Reporter.dropped`), with one warning. At interpreter exit the default
reporter flushes for up to ``RLARK_REPORT_FLUSH_SECONDS`` (5 s).
"""

from __future__ import annotations

import atexit
import http.client
import json
import logging
import math
import os
import ssl
import threading
import time
import warnings
from collections import deque
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

LOG = logging.getLogger("rlark")

#: The server's limit on one report's JSON body.
MAX_REPORT_BYTES = 16 * 1024
#: The server's limits on a report's ``type``.
MAX_TYPE_CHARS = 63
#: Reports queued at most by default before new ones are dropped.
DEFAULT_MAX_PENDING = 10_000
BACKOFF_INITIAL = 0.2
BACKOFF_MAX = 10.0
#: The longest ``Retry-After`` honoured; longer ones are cut to it.
RETRY_AFTER_MAX = 30.0
REQUEST_TIMEOUT = 10.0
DEFAULT_FLUSH_SECONDS = 5.0


class ReportError(ValueError):
    """A report that the server would refuse (names the problem); raised by
    :func:`report` and :func:`event` at the call, nothing is queued."""


def _plain(value: Any, path: str) -> Any:
    """`value` as JSON-serialisable plain data; numpy scalars and arrays through ``.item()``
    / ``.tolist()``. Non-finite floats are refused: JSON has no NaN."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ReportError(f"{path} is {value}: JSON has no NaN or infinity")
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ReportError(f"{path} has a key {key!r} that is not a string")
            out[key] = _plain(item, f"{path}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays and scalars
        return _plain(value.tolist(), path)
    if hasattr(value, "item") and callable(value.item):  # torch scalars
        return _plain(value.item(), path)
    raise ReportError(f"{path} is a {type(value).__name__}, which is not JSON")


def build_report(type: str, fields: Mapping[str, Any]) -> bytes:
    """The JSON body of one report, checked as the server checks it.

    Raises :class:`ReportError` naming the problem: ``type`` not 1 to 63 characters, a
    field named ``type``, a value that is not JSON (NaN included), a body over 16 KiB.
    """
    if not isinstance(type, str) or not 1 <= len(type) <= MAX_TYPE_CHARS:
        raise ReportError(f"report type must be a string of 1 to {MAX_TYPE_CHARS} characters, got {type!r}")
    if "type" in fields:
        raise ReportError("a report field cannot be named 'type': it is the report's type")
    body = {"type": type}
    for key, value in fields.items():
        body[key] = _plain(value, key)
    data = json.dumps(body, allow_nan=False, separators=(",", ":")).encode()
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(
            f"report of type {type!r} is {len(data)} bytes of JSON; the server takes at most "
            f"{MAX_REPORT_BYTES}"
        )
    return data


class Reporter:
    """Posts reports to ``url`` from a background thread (see the module docs).

    ``submit`` never blocks and never raises for the network; ``flush`` waits for what was
    submitted; ``close`` flushes and stops the thread.
    """

    def __init__(
        self,
        url: str,
        token: str,
        ca_file: str | None = None,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError(f"report URL {url!r} is not an http(s) URL")
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port
        self._path = parts.path + (f"?{parts.query}" if parts.query else "")
        self._token = token
        self._context = (
            ssl.create_default_context(cafile=ca_file) if parts.scheme == "https" else None
        )
        self._timeout = timeout
        self._max_pending = max_pending
        self._queue: deque[bytes] = deque()
        self._cond = threading.Condition()
        self._in_flight = 0
        self._closing = False
        self._conn: http.client.HTTPConnection | None = None
        #: Reports posted and stored (201).
        self.sent = 0
        #: Reports dropped: queue full, refused by the server, or left at close.
        self.dropped = 0
        self._warned_full = False
        self._thread = threading.Thread(target=self._run, name="rlark-reporter", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Reports submitted and not yet sent or dropped."""
        with self._cond:
            return len(self._queue) + self._in_flight

    def submit(self, body: bytes) -> bool:
        """Queue one report body (from :func:`build_report`). ``False`` when it was dropped
        because the queue is full or the reporter is closed."""
        with self._cond:
            if self._closing:
                self.dropped += 1
                return False
            if len(self._queue) + self._in_flight >= self._max_pending:
                self.dropped += 1
                if not self._warned_full:
                    self._warned_full = True
                    LOG.warning(
                        "rlark: %d reports are waiting to be sent; dropping new ones "
                        "(is the server reachable?)",
                        self._max_pending,
                    )
                return False
            self._queue.append(body)
            self._cond.notify_all()
            return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted report was sent or dropped; ``False`` when ``timeout``
        seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._in_flight:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float | None = DEFAULT_FLUSH_SECONDS) -> bool:
        """Flush for up to ``timeout`` seconds, then stop; reports still queued are dropped
        (counted, and logged as a warning). ``True`` when nothing was dropped."""
        flushed = self.flush(timeout)
        with self._cond:
            self._closing = True
            left = len(self._queue) + self._in_flight
            self.dropped += len(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        if left:
            LOG.warning("rlark: %d reports were not sent before exit", left)
        self._thread.join(timeout=1.0)
        return flushed

    # The sending thread.

    def _run(self) -> None:
        backoff = BACKOFF_INITIAL
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                body = self._queue.popleft()
                self._in_flight = 1
            while True:
                wait = self._send(body)
                if wait is None:
                    backoff = BACKOFF_INITIAL
                    break
                wait = backoff if wait < 0 else wait
                backoff = min(backoff * 2, BACKOFF_MAX)
                # New submissions notify the condition too: wait out the whole pause.
                deadline = time.monotonic() + wait
                with self._cond:
                    while not self._closing and (left := deadline - time.monotonic()) > 0:
                        self._cond.wait(left)
                    if self._closing:
                        self.dropped += 1
                        self._in_flight = 0
                        self._cond.notify_all()
                        return
            with self._cond:
                self._in_flight = 0
                self._cond.notify_all()

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._context is not None:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self._timeout, context=self._context
                )
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        return self._conn

    def _send(self, body: bytes) -> float | None:
        """Post one report. ``None``: done (sent or dropped for good); otherwise retry after
        that many seconds (negative: after the backoff)."""
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Content-Type": "application/json",
        }
        try:
            conn = self._connection()
            conn.request("POST", self._path, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read()
            status = response.status
            retry_after = response.getheader("Retry-After")
        except (OSError, http.client.HTTPException) as error:
            LOG.debug("rlark: report not sent, will retry: %s", error)
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            return -1.0
        with self._cond:
            if status in (200, 201):
                self.sent += 1
                return None
        if status == 429 or status >= 500:
            if retry_after is not None:
                try:
                    return min(max(float(retry_after), 0.0), RETRY_AFTER_MAX)
                except ValueError:
                    pass
            return -1.0
        with self._cond:
            self.dropped += 1
        LOG.warning(
            "rlark: the server refused a report with %d: %s", status, _status_message(text)
        )
        return None


def _status_message(body: bytes) -> str:
    """The ``message`` of a Kubernetes ``Status`` body, else the body itself."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else body.decode(errors="replace")[:500]


# The process-wide default reporter, made from the environment on first use.

_default: Reporter | None = None
_default_lock = threading.Lock()
_warned_outside = False


def default_reporter(environ: Mapping[str, str] | None = None) -> Reporter | None:
    """The reporter :func:`report` and :func:`event` use: from ``RLARK_REPORT_URL``,
    ``RLARK_TOKEN`` and ``RLARK_CA_FILE``; ``None`` outside a task (a warning, once)."""
    global _default, _warned_outside
    with _default_lock:
        if _default is not None:
            return _default
        env = os.environ if environ is None else environ
        url = env.get("RLARK_REPORT_URL")
        if not url:
            if not _warned_outside:
                _warned_outside = True
                warnings.warn(
                    "rlark: RLARK_REPORT_URL is not set (not running as an rlark task, or "
                    "the agent could not mint a task token): reports are not sent",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return None
        _default = Reporter(url, env.get("RLARK_TOKEN", ""), env.get("RLARK_CA_FILE") or None)
        atexit.register(_close_default)
        return _default


def _close_default() -> None:
    reporter = _default
    if reporter is None:
        return
    try:
        seconds = float(os.environ.get("RLARK_REPORT_FLUSH_SECONDS", DEFAULT_FLUSH_SECONDS))
    except ValueError:
        seconds = DEFAULT_FLUSH_SECONDS
    reporter.close(seconds)


def report(step: int | None = None, reward: float | None = None, **metrics: Any) -> None:
    """Report training progress: ``{"type": "reward", "value": reward, "step": step, ...}``
    with ``reward``, else ``{"type": "metrics", "step": step, ...}``; ``metrics`` are further
    fields (numbers, strings, lists, dicts; numpy values are converted).

    Returns at once: the report is sent in the background. Raises :class:`ReportError` for
    a report the server would refuse. Outside a task it does nothing (one warning).
    """
    fields: dict[str, Any] = {}
    if reward is not None:
        fields["value"] = reward
    if step is not None:
        fields["step"] = step
    for key, value in metrics.items():
        if key in fields:
            raise ReportError(f"{key!r} is given twice")
        fields[key] = value
    body = build_report("reward" if reward is not None else "metrics", fields)
    reporter = default_reporter()
    if reporter is not None:
        reporter.submit(body)


def event(type: str, **fields: Any) -> None:
    """Report an event of your own ``type`` (1 to 63 characters: ``checkpoint``,
    ``episode``, ...) with any JSON ``fields``; like :func:`report`, in the background."""
    body = build_report(type, fields)
    reporter = default_reporter()
    if reporter is not None:
        reporter.submit(body)


def flush(timeout: float | None = None) -> bool:
    """Wait until the reports made so far were sent (or dropped); ``False`` when ``timeout``
    seconds passed first. ``True`` outside a task."""
    reporter = _default
    return True if reporter is None else reporter.flush(timeout)
