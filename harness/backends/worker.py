"""A worker process spoken to in JSON lines: one request line on its stdin, one reply line on its stdout.

An engine that needs its own Python environment (vLLM pins its own torch and transformers) runs as such a worker
(:mod:`harness.backends.vllm_worker`). Every failure is one :class:`BackendError` line that says what happened:
the worker could not start, exited (with its exit code and the last line of its log), sent a line that is not a
JSON object, answered ``{"ok": false, "error": ...}``, or did not answer in time. The worker's stderr (its log) goes
to a temporary file, read back only for the error message.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import tempfile
import time
from typing import Any

from harness.backends.contract import BackendError

PARENT_ENV = "DRAFTBENCH_WORKER_PARENT"  # the harness's pid, so that a worker can leave when the harness is gone


class Worker:
    """``argv``: the worker's command line; ``env``: extra environment variables; ``what``: how errors name it.
    The worker's environment names the harness's pid (:data:`PARENT_ENV`)."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, what: str = "worker"):
        self.what = what
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (kept open for the worker's life; closed in close)
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                         env={**os.environ, PARENT_ENV: str(os.getpid()), **(env or {})},
                                         close_fds=True,
                                         start_new_session=True)  # its own process group: see close
        except OSError as e:
            self.log.close()
            raise BackendError(f"{what}: cannot start {argv[0]}: {e.strerror or e}") from None
        self.buffer = b""

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send ``message``; its reply without the ``ok`` key, or :class:`BackendError`."""
        op = message.get("op", "request")
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise BackendError(f"{self.what} exited before {op}{self._exit_note()}") from None
        line = self._read_line(timeout, op)
        try:
            reply = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            reply = None
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            raise BackendError(f"{self.what} sent a malformed reply to {op}: {line[:120]!r}")
        if not reply["ok"]:
            raise BackendError(f"{self.what} failed in {op}: {reply.get('error') or 'no error message'}")
        reply.pop("ok")
        return reply

    def _read_line(self, timeout: float, op: str) -> bytes:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise BackendError(f"{self.what} did not answer {op} within {timeout:g} s")
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise BackendError(f"{self.what} exited during {op}{self._exit_note()}")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def _exit_note(self) -> str:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        self.log.seek(0)
        lines = [x for x in self.log.read().decode(errors="replace").splitlines() if x.strip()]
        return (f" (exit code {code})" if code is not None else "") + (f"; its log ends: {lines[-1][:300]}"
                                                                       if lines else "")

    def close(self, timeout: float = 30.0) -> None:
        """Ask the worker to exit; kill it when it does not. Safe to call twice."""
        if self.proc.poll() is None:
            try:
                self.request({"op": "close"}, timeout)
            except BackendError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:  # the worker and what it spawned (vLLM's engine process)
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):  # a dead worker's stdin cannot take the buffered rest
                stream.close()
        self.log.close()
