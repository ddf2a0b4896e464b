"""HTTP to a served engine, standard library only: one exchange bounded as a whole by its deadline (a watchdog
shuts the socket down), a GET, waiting for a server to be ready, a URL with its password masked, and the limits on
what the harness reads of a server (memory bounded whatever a server sends)."""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator

from harness.backends.contract import (
    BackendError,
)

# what the harness reads of a server at most: one streamed line, one turn's stream, one GET answer's body (/metrics,
# /v1/models...); past any, the exchange fails at once, read no further (memory bounded whatever a server sends).
# A line has room for llama.cpp's last verbose chunk, which echoes the prompt (a long-context one, JSON-escaped)
LINE_MAX_BYTES = 4 << 20
STREAM_MAX_BYTES = 256 << 20
BODY_MAX_BYTES = 8 << 20


class Late(BackendError):
    """An exchange that ran past its deadline (:class:`Exchange`)."""


# where a resumed run's server password comes from: the manifest stores every server URL masked (:func:`masked`)
PASSWORD_ENV = "DRAFTBENCH_SERVER_PASSWORD"


def masked(url: str) -> str:
    """``url`` with the password of its user part, if any, as ``***``: what every message, manifest and record
    shows. Everything between the first ``:`` of the user part and the last ``@`` counts as the password, so that
    one with an unescaped ``/`` or ``@`` is masked too.
    Examples: "http://user:pass@h:8000" -> "http://user:***@h:8000"; "http://h:8000" -> "http://h:8000"."""
    scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if not sep or at < 0:
        return url
    user, colon, _ = rest[:at].partition(":")
    return f"{scheme}://{user}:***@{rest[at + 1:]}" if colon else url


def unmasked(url: str) -> str:
    """``url`` ready to be requested: as given, or, where its password is the mask ``***`` (a run resumed from its
    manifest, which never stores a password), with the password from ``$DRAFTBENCH_SERVER_PASSWORD``
    (:data:`PASSWORD_ENV`); without that variable, one :class:`BackendError` line saying how to give it. Example:
    "http://u:***@h:8000" with the variable "s3cret" -> "http://u:s3cret@h:8000"."""
    if masked(url) != url or ":***@" not in url:
        return url
    password = os.environ.get(PASSWORD_ENV)
    if not password:
        raise BackendError(f"{url}: the run stores server passwords masked; set {PASSWORD_ENV} to the server's "
                           f"password to resume it")
    scheme, _, rest = url.partition("://")
    at = rest.rfind("@")
    user = rest[:at].partition(":")[0]
    return f"{scheme}://{user}:{urllib.parse.quote(password, safe='')}@{rest[at + 1:]}"


class Exchange:
    """One HTTP request to a server, bounded as a whole by ``deadline`` (:func:`time.monotonic` seconds): the
    connection, the request, the answer's headers and every read of its body. A watchdog shuts the socket down at
    the deadline, so a server that drips its bytes (headers, a body, a stream) cannot hold a read past it; a
    socket timeout alone bounds one read, not the exchange. The user part of ``url`` (``http://user:pass@host``)
    is sent as HTTP basic authentication and shown masked (:func:`masked`). No proxy: the harness talks to the
    server itself (a proxy in between would be measured too). ``limit_s``: the bound, for the message."""

    def __init__(self, method: str, url: str, deadline: float, limit_s: float, body: bytes | None = None,
                 headers: dict[str, str] | None = None):
        self.what, self.limit_s, self.expired = f"{method} {masked(url)}", limit_s, False
        self.conn = self.sock = self.response = self.timer = self.password = None
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError:
            raise BackendError(f"{self.what}: not a URL the harness can reach (its host or port)") from None
        self.password = urllib.parse.unquote(parts.password or "") or None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BackendError(f"{self.what}: not an http:// or https:// URL with a host")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self.late()
        auth = {}
        if parts.username is not None:
            user = f"{urllib.parse.unquote(parts.username)}:{self.password or ''}"
            auth["Authorization"] = "Basic " + base64.b64encode(user.encode()).decode()
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self.conn = kind(parts.hostname, port, timeout=remaining)
        self.timer = threading.Timer(remaining, self._expire)
        self.timer.daemon = True
        self.timer.start()
        try:
            self.conn.connect()
            self.sock = self.conn.sock  # the response keeps using it after the connection lets go of it
            if self.expired:  # the watchdog fired while connecting, before it had a socket to shut
                raise self.late()
            self.conn.request(method, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body=body,
                              headers={**auth, **(headers or {})})
            self.response = self.conn.getresponse()
        except BaseException as e:
            self.close()
            if isinstance(e, Exception):
                raise self.failure(e) from None
            raise

    def _expire(self) -> None:
        self.expired = True
        with contextlib.suppress(OSError, AttributeError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def late(self) -> Late:
        return Late(f"{self.what}: no answer within {self.limit_s:g} s")

    def failure(self, exc: Exception) -> BackendError:
        """One line for a failed exchange (never the password, even where an exception quotes the URL)."""
        if self.expired or isinstance(exc, (TimeoutError, socket.timeout)):
            return self.late()
        if isinstance(exc, BackendError):
            return exc
        if isinstance(exc, ConnectionRefusedError):
            return BackendError(f"{self.what}: connection refused (is the server running?)")
        text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        if isinstance(exc, http.client.HTTPException):
            text = f"{type(exc).__name__}: {text}"
        if self.password:
            text = text.replace(self.password, "***")
        return BackendError(f"{self.what}: {text[:200]}")

    def read1(self) -> bytes:
        """The next bytes of the body (b"" at its end)."""
        try:
            data = self.response.read1(65536)
        except Exception as e:
            raise self.failure(e) from None
        if self.expired:
            raise self.late()
        return data

    def body(self, limit: int, cut: bool = False) -> bytes:
        """The whole body, at most ``limit`` bytes: a longer one is a BackendError, or with ``cut`` its start."""
        out = bytearray()
        while data := self.read1():
            out += data
            if len(out) > limit:
                if cut:
                    return bytes(out[:limit])
                raise BackendError(f"{self.what} answered a body over {limit} bytes: refused")
        return bytes(out)

    def lines(self, line_limit: int, total_limit: int) -> Iterator[bytes]:
        """The body's lines (without their newline), none longer than ``line_limit`` bytes and all of them at most
        ``total_limit`` bytes: past either, a BackendError, read no further."""
        buf, total = bytearray(), 0
        while data := self.read1():
            total += len(data)
            if total > total_limit:
                raise BackendError(f"{self.what} streamed over {total_limit} bytes: refused, read no further")
            scanned = len(buf)
            buf += data
            start = 0
            while (end := buf.find(b"\n", max(start, scanned))) >= 0:
                yield bytes(buf[start:end])
                start = end + 1
            del buf[:start]
            if len(buf) > line_limit:
                raise BackendError(f"{self.what} streamed a line over {line_limit} bytes without its end: refused, "
                                   "read no further")
        if buf:
            yield bytes(buf)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        for part in (self.response, self.conn):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.close()


def http_get(url: str, timeout: float) -> tuple[int, str]:
    """GET ``url``, the whole exchange within ``timeout`` s: (status, body); an HTTP error status is returned, not
    raised; no answer in time, or a body over :data:`BODY_MAX_BYTES`, is a BackendError."""
    exchange = Exchange("GET", url, time.monotonic() + timeout, timeout)
    try:
        status = exchange.response.status
        return status, exchange.body(BODY_MAX_BYTES, cut=status != 200).decode(errors="replace")
    finally:
        exchange.close()


def wait_ready(url: str, timeout: float, alive: Callable[[], None] | None = None) -> None:
    """Wait until ``url``/health answers 200 (a server without /health: until /v1/models does), within ``timeout``
    s as a whole (each try gets what is left, at most 10 s: a server that drips its answer cannot stretch it).
    ``alive``: for a server the harness started, called between tries, raises when its process has died; a refused
    connection is then retried (a starting server does not listen yet), while for a server started elsewhere it is
    the error at once. Any other failure is retried until ``timeout``; the last one is the error."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        if alive is not None:
            alive()
        try:
            left = deadline - time.monotonic()
            if left > 0:
                status, body = http_get(url + "/health", min(10.0, left))
                if status == 404:
                    status, body = http_get(url + "/v1/models", min(10.0, max(deadline - time.monotonic(), 0.01)))
                if status == 200:
                    return
                last = f"GET /health answered HTTP {status} {body.strip()[:80]}".rstrip()
        except BackendError as e:
            if alive is None and "connection refused" in str(e):
                raise
            last = str(e)
        if time.monotonic() >= deadline:
            raise BackendError(f"the server at {masked(url)} is not ready after {timeout:g} s: {last}")
        time.sleep(min(0.25, max(deadline - time.monotonic(), 0.0)))
