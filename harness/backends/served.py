"""Served engines (``engine: openai``): any OpenAI-compatible server (vLLM, SGLang, ``trtllm-serve``, llama.cpp's
``llama-server``), measured through its HTTP API, one request at a time.

Where the server is: ``engine_options: {server_url: http://host:port}`` (``draftbench run --server-url URL``), a
server started elsewhere and measured as it runs (the entry's method options cannot configure it and are refused);
or ``engine_options: {launch: vllm}``, a local ``vllm serve`` started from vLLM's venv (``make vllm-setup``) with the
speculative configuration the in-process vLLM backend maps for the entry's method (:mod:`harness.backends.launch`),
or ``{launch: llama.cpp}``, the ``llama-server`` at ``$DRAFTBENCH_LLAMA_SERVER`` with the entry's other engine
options as its flags, or ``{launch: sglang}``, SGLang's server from its venv (``$DRAFTBENCH_SGLANG_PYTHON``), its
flags likewise (and the entry's ``head``, the one method option it takes, as ``--speculative-draft-model-path``:
:data:`FLAG_OPTIONS`), stopped at the end of the run, also on Ctrl-C and on failure.

Each turn is one streamed request (server-sent events) to ``/v1/chat/completions`` with the conversation's messages
(the server applies its own chat template), or with ``api: completions`` to ``/v1/completions`` with the harness's
own token ids of the rendered prompt as the prompt (the same tokens the harness feeds its methods), with the turn's
temperature, top_p, top_k (when set), seed and token budget (``max_tokens``). It asks for token ids (vLLM's
``return_token_ids``; from a llama.cpp server, known by its ``/props`` or ``llamacpp:`` counters, its ``verbose``,
which puts each /v1/completions chunk's token in ``__verbose.tokens``; its chat stream has text only; from
``trtllm-serve``, known by its JSON ``/metrics``, which answers HTTP 400 to a field its requests do not declare, not
``return_token_ids`` but, on /v1/completions, ``detokenize: false``, which gives each chunk its ``token_ids`` and no
text; its chat stream has text only) and the usage count. Measured, as the harness measures its own turns: wall time
from sending the request to the end of the stream, time to the first token, and per new token its arrival time
(``token_times_s``): exact where every chunk carries one token id; a chunk of several tokens has its time split
evenly over them since the previous chunk (the record's ``engine_notes`` says so). A server that sends text without
token ids gives ``output_ids`` null (the losslessness check is then n/a for the turn, never a pass) and its own
token count (``usage``), and per-token times only where it sent as many chunks as tokens; the notes say so. So does
a turn whose chunks carried fewer ids than that count (llama.cpp sends no chunk for a token ending inside a UTF-8
character): ids that skip a token are never recorded.

Acceptance: the server's Prometheus counters (:mod:`harness.backends.prometheus`) read before and after each request
(concurrency 1: nothing else may use the server meanwhile) and diffed (a load level, :mod:`harness.run.load`, reads
them around all its requests instead); a counter the server lacks is None (n/a). ``trtllm-serve``'s ``/metrics`` is
no counter but its engine iterations since the previous read, which the read removes: the client keeps what it
reads, and a turn's drafts (iterations that drafted), drafted and accepted tokens are the sums of the
``specDecodingStats`` of the iterations read between its two reads (None where none has them: a server without
speculation, or without ``enable_iter_perf_stats``); it has no per-position counter (n/a). Read in TensorRT-LLM's
source (paths and commits in :mod:`harness.backends.prometheus`) and tested against a fake server only
(tests/support/fake_openai_server.py): TensorRT-LLM needs an NVIDIA GPU, not run here.
The per-step accepted and drafted tokens, from which τ and the per-step histogram are derived as for the harness's
own turns: vLLM's per-request metrics where the server sends them (``metrics.speculative_decoding`` on the usage
chunk, ordered ``per_step_accepted`` / ``per_step_drafted`` with ``vllm serve --per-request-spec-decode-metrics
detailed``, which ``launch: vllm`` sets); else from vLLM's drafts and per-position counters
(:func:`harness.backends.contract.steps_from_counters`; the order of the steps is not in the counters); from an
SGLang server (its ``sglang:`` metrics or ``/server_info``), which has no such counters, its per-request
``spec_tokens_details`` (:func:`sglang_steps`: verification forwards, drafted and accepted tokens and the histogram
of accepted drafts per forward, which no other client can move); from trtllm-serve, one step per iteration that
drafted, in order (:meth:`ServedBackend._steps_from_trtllm`), refused where the iterations cannot be this request's
alone or account for fewer tokens than it has (iterations taken by another reader of ``/metrics``). The
drafted and accepted totals: llama.cpp's per-request ``timings`` (``draft_n``, ``draft_n_accepted`` on the request's
last chunk, :func:`request_totals`) where it sends them, which no other client can move, else the counters; the
record's ``engine_notes`` say which. An entry
that speculates on a server with neither fails its turns with one line saying so: its forwards cannot be counted.
The turn's target forwards, which fix how many of its forwards drafted nothing
(:func:`harness.backends.contract.accept_lengths`): vLLM's engine iterations (``vllm:iteration_tokens_total``'s
count, :func:`harness.backends.prometheus.read_iterations`) diffed around the request, as in-process vLLM counts
them; from a server without that count (trtllm-serve's iterations are not read as forwards) they are derived from
the steps, which overstates τ when the last drafting step ran past the budget, and the record's notes say so.

Every failure is one :class:`BackendError` line naming the server (its password masked, :func:`masked`) and what
happened: refused connection, no answer in time, a server not ready, an HTTP error status (with the start of its
body), a stream cut before its end, an error sent inside the stream, a server that serves another model (checked
against ``/v1/models`` before the run), counters that moved by more than one request, a ``/metrics`` that is no
longer what it was when the run started.

A server's numbers are measured, not believed (:meth:`ServedBackend.stream`): the turn's tokens are the ids or
chunks of text that arrived, each id an integer within the target's vocabulary; ``usage.completion_tokens`` is
checked against them and the request's budget; a stream past the budget is an error, read no further; per-request
counts are checked against the turn's tokens (:func:`checked_per_request`); counters are finite whole numbers that
never go backwards, their ``position`` labels below :data:`harness.backends.prometheus.MAX_DRAFT_POSITIONS`. Each
exchange is bounded as a whole (:class:`Exchange`): ``timeout_s`` the turn, ``startup_timeout_s`` the wait for the
server; and so is what is read (:data:`LINE_MAX_BYTES`, :data:`STREAM_MAX_BYTES`, :data:`BODY_MAX_BYTES`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from harness.backends.contract import (
    Backend,
    BackendError,
    EngineError,
    EngineTurn,
    TurnRequest,
    steps_from_counters,
)
from harness.backends.exchange import (
    LINE_MAX_BYTES,
    STREAM_MAX_BYTES,
    Exchange,
    Late,
    http_get,
    masked,
    unmasked,
    wait_ready,
)
from harness.backends.prometheus import (
    COUNTERS,
    ITERATIONS,
    TRTLLM,
    TRTLLM_FIELDS,
    CounterError,
    TrtllmIteration,
    diff,
    read_counters,
    read_iterations,
    read_trtllm,
    server_kind,
    trtllm_counters,
)
from harness.backends.replies import checked_count, checked_field, checked_per_request, request_totals, sglang_steps
from harness.measure.records import UNORDERED_STEPS

OPTIONS = ("server_url", "launch", "model", "api", "timeout_s", "startup_timeout_s", "gguf")  # this backend's own
LAUNCHES = ("vllm", "llama.cpp", "sglang")
# a launched server configured by its own flags: its name in errors and one flag as an example
FLAG_SERVERS = {"llama.cpp": ("llama-server", "spec_type: ngram-simple -> --spec-type ngram-simple"),
                "sglang": ("sglang.launch_server", "speculative_algorithm: NGRAM -> --speculative-algorithm NGRAM")}
# the method options a launched flag server takes as one of its own flags: SGLang's draft model is the entry's head
FLAG_OPTIONS = {"sglang": {"head": "speculative_draft_model_path"}}
APIS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
TIMEOUT_S = 900.0        # a turn (its request, its stream and its counter readings) not over by then failed
READY_TIMEOUT_S = 30.0   # a server at server_url that is still loading: how long to wait for /health
SETTLE_S = 0.05          # counters are re-read until two readings this far apart agree (a server updates them late)
SETTLE_MAX_S = 2.0
# llama.cpp's own request field: each streamed chunk of /v1/completions carries its token id (``__verbose.tokens``)
LLAMACPP_FIELDS = {"verbose": True}
# SGLang's: a chunk before the usage carries the request's speculative statistics (``sglext.spec_tokens_details``)
SGLANG_FIELDS = {"return_spec_tokens_details": True}
# trtllm-serve's: its requests forbid fields they do not declare (``OpenAIBaseModel``: ``extra="forbid"`` in
# tensorrt_llm/serve/openai_protocol.py at 0076e93), return_token_ids among them (HTTP 400); with
# ``detokenize: false`` its /v1/completions chunks carry ``token_ids`` and empty text
# (``completion_stream_post_processor``, tensorrt_llm/serve/postprocess_handlers.py at 01bf192)
TRTLLM_DROP = ("return_token_ids",)
TRTLLM_COMPLETIONS_FIELDS = {"detokenize": False}
TRTLLM_MARK = "trtllm_iterations"  # a trtllm-serve reading: how many iterations the client has read so far


def check_options(method: str, given: set[str], engine_options: dict[str, Any] | None) -> dict[str, Any]:
    """This backend's options of ``engine_options`` with their defaults; an :class:`EngineError` for a missing or
    contradictory server (``server_url`` xor ``launch``) and, with ``server_url``, for anything that would have to
    configure a server the harness does not start (method options, other engine options)."""
    opts = dict(engine_options or {})
    url, launch = opts.get("server_url"), opts.get("launch")
    if (url is None) == (launch is None):
        raise EngineError("engine openai needs exactly one of engine_options server_url (a running server, "
                          "--server-url URL) or launch: vllm, llama.cpp or sglang (a local server started for the "
                          "run)")
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise EngineError(f"engine openai: server_url must be an http:// or https:// URL, got "
                          f"{masked(url) if isinstance(url, str) else url!r}")
    if launch is not None and launch not in LAUNCHES:
        raise EngineError(f"engine openai: launch {launch!r} is not known; it launches {' or '.join(LAUNCHES)}")
    if opts.get("api", "chat") not in APIS:
        raise EngineError(f"engine openai: api {opts['api']!r} is not known; use {' or '.join(APIS)}")
    if url is not None:
        extra = sorted(set(opts) - set(OPTIONS))
        if given or extra:
            raise EngineError(f"engine openai, method {method!r} at {masked(url)}: "
                              f"{', '.join(sorted(given) + extra)} would configure the server, which runs as it "
                              "was started; start it with them, or use launch: vllm")
    if "gguf" in opts and launch != "llama.cpp":
        raise EngineError("engine openai: engine_options gguf is the model file of launch: llama.cpp only")
    mapped = FLAG_OPTIONS.get(launch, {})
    if launch in FLAG_SERVERS and given - set(mapped):
        server, example = FLAG_SERVERS[launch]
        raise EngineError(f"engine openai, method {method!r} on launch: {launch}: method options "
                          f"({', '.join(sorted(given - set(mapped)))}) are not mapped to {server}; pass its flags as "
                          f"engine_options ({example})")
    for option, flag in mapped.items():
        if option in given and flag in opts:
            raise EngineError(f"engine openai, method {method!r} on launch: {launch}: the method option {option} "
                              f"is the engine option {flag}; give one of them")
    return {"api": "chat", "timeout_s": TIMEOUT_S, **opts}


def option_flags(launch: str | None, options: Any, given: set[str]) -> dict[str, Any]:
    """The flags of a launched flag server that the entry's method options give (:data:`FLAG_OPTIONS`).
    Example: ("sglang", Eagle3Options(head="/h"), {"head"}) -> {"speculative_draft_model_path": "/h"};
    ("sglang", Eagle3Options(), set()) -> {}."""
    values = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options or {})
    return {flag: values[option] for option, flag in FLAG_OPTIONS.get(launch, {}).items()
            if option in given and values.get(option) is not None}


class ServedBackend(Backend):
    """One method entry on a server. ``target``: the run's target name, ``target_path`` its folder (the model the
    server must serve); ``speculative``: whether the entry speculates (its turns then need the server's acceptance
    counters); ``server``: a launched server (:class:`harness.backends.launch.ServerProcess`, stopped by
    :meth:`close`) or None; ``config``: what configured the server, for the manifest."""

    name = "openai"

    def __init__(self, url: str, options: dict[str, Any], target: str, target_path: str, speculative: bool,
                 server=None, config: dict[str, Any] | None = None, vocab: int | None = None):
        # requests go to endpoint; url, its password masked, is what messages, the manifest and records show
        self.endpoint = unmasked(url).rstrip("/")
        self.url, self.options, self.speculative, self.server = masked(self.endpoint), options, speculative, server
        self.timeout, self.vocab = float(options["timeout_s"]), vocab
        try:
            if server is None:
                wait_ready(self.endpoint, float(options.get("startup_timeout_s", READY_TIMEOUT_S)))
            self.model = self._check_model(options.get("model"), target, target_path)
            self.version, kind, self.slots = self._version()
            self.trtllm: list[TrtllmIteration] = []  # trtllm-serve's iterations read so far (its reads drain)
            status, text = http_get(self.endpoint + "/metrics", self.timeout)
            self.has_metrics = status == 200 and self._counters_of(text) is not None
            self.server_kind = (server_kind(text) if self.has_metrics else None) or kind
        except BaseException:
            self.close()
            raise
        self.config = {"server_url": self.url, "api": options["api"], "model": self.model, **(config or {}),
                       **({"slots": self.slots} if self.slots is not None else {})}

    def _check_model(self, wanted: str | None, target: str, target_path: str) -> str:
        status, body = http_get(self.endpoint + "/v1/models", self.timeout)
        try:
            served = [m["id"] for m in json.loads(body)["data"]] if status == 200 else None
        except (ValueError, KeyError, TypeError):
            served = None
        if served is None:
            raise BackendError(f"GET {self.url}/v1/models answered HTTP {status} without a model list: "
                               f"{body.strip()[:120]}")
        names = [wanted] if wanted else [target, target_path, target_path.rstrip("/").rsplit("/", 1)[-1]]
        for name in names:
            if name in served:
                return name
        raise BackendError(f"the server at {self.url} serves {', '.join(served) or 'no model'}, not "
                           f"{wanted or target} ({target_path}); point at a server of the run's target, or name its "
                           "model with engine_options model: NAME if it is the same model")

    def _version(self) -> tuple[str | None, str | None, int | None]:
        """(the server's version, the server it names itself or None, its slots or None): ``/version`` (vLLM), else
        llama.cpp's ``/props``, whose ``build_info`` is ``b<build number>-<commit>`` and whose ``total_slots`` are
        the requests it decodes at once (``--parallel``; more wait in its queue), else SGLang's ``/server_info``
        (0.5.23 has no ``/version``); (None, None, None) where none says (n/a)."""
        for path, key, kind in (("/version", "version", None), ("/props", "build_info", "llama.cpp"),
                                ("/server_info", "version", "sglang")):
            try:
                status, body = http_get(self.endpoint + path, self.timeout)
                if status == 200:
                    answer = json.loads(body)
                    slots = answer.get("total_slots") if kind == "llama.cpp" else None
                    return str(answer[key]), kind, slots if isinstance(slots, int) else None
            except (BackendError, ValueError, KeyError, TypeError, AttributeError):
                pass
        return None, None, None

    def _counters_of(self, text: str) -> dict[str, Any] | None:
        """The counters of a ``/metrics`` text; None for a text in neither format (no counters). Counters in the
        format whose values cannot be counters are a BackendError naming the server and the metric."""
        try:
            if server_kind(text) == TRTLLM:
                read_trtllm(text)
                return {TRTLLM_MARK: 0}
            return read_counters(text)
        except CounterError as e:
            raise BackendError(f"GET {self.url}/metrics: {e}") from None
        except ValueError:
            return None  # neither the exposition format nor trtllm-serve's iterations: no counters

    def _reading(self, deadline: float | None = None) -> tuple[dict[str, Any], int | None]:
        """One ``/metrics`` reading: the acceptance counters and vLLM's engine iterations (None where absent). From
        trtllm-serve, whose reads drain its queue of iterations, the iterations are kept (:attr:`trtllm`) and the
        reading is how many have been read (``{TRTLLM_MARK: n}``), which :meth:`counters_between` turns into
        counters; something other than its JSON iterations is a BackendError saying what. ``deadline``: the turn's
        (:meth:`generate`), else ``timeout_s`` from now."""
        status, text = http_get(self.endpoint + "/metrics", self._left(deadline))
        if self.server_kind == TRTLLM:
            if status != 200:
                raise BackendError(f"GET {self.url}/metrics answered HTTP {status}, though it had trtllm-serve's "
                                   f"iteration statistics when the run started: {text.strip()[:120]}")
            try:
                self.trtllm += read_trtllm(text)
            except ValueError as e:
                raise BackendError(f"GET {self.url}/metrics answered what is not trtllm-serve's iteration "
                                   f"statistics: {e}") from None
            return {TRTLLM_MARK: len(self.trtllm)}, None
        counters = self._counters_of(text) if status == 200 else None
        if counters is None:
            raise BackendError(f"GET {self.url}/metrics answered HTTP {status} without Prometheus counters, though "
                               "it had them when the run started")
        try:
            return counters, read_iterations(text)
        except CounterError as e:
            raise BackendError(f"GET {self.url}/metrics: {e}") from None

    def _left(self, deadline: float | None) -> float:
        """Seconds left to ``deadline`` (``timeout_s`` where None); a BackendError when none are."""
        if deadline is None:
            return self.timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise BackendError(f"the turn at {self.url} was not over within {self.timeout:g} s (timeout_s bounds "
                               "the whole turn: its request, its stream and its counter readings)")
        return left

    def settled_reading(self, deadline: float | None = None) -> tuple[dict[str, Any], int | None]:
        """:meth:`_reading` once two readings :data:`SETTLE_S` apart agree (a server may count a request's last
        steps after it has sent the last chunk)."""
        last, settle = self._reading(deadline), time.monotonic() + SETTLE_MAX_S
        while time.monotonic() < settle:
            time.sleep(SETTLE_S)
            now = self._reading(deadline)
            if now == last:
                break
            last = now
        return last

    def settled_counters(self) -> dict[str, Any]:
        """The settled acceptance counters (:meth:`settled_reading`); a load level reads them before and after all
        its requests (:meth:`counters_between`)."""
        return self.settled_reading()[0]

    def counters_between(self, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        """The acceptance counters moved between two readings: their difference (:func:`diff`), or from
        trtllm-serve the counters of the iterations read between them (:func:`trtllm_counters`; None where those
        have no ``specDecodingStats``, never 0). A counter that went backwards is a BackendError naming it."""
        if TRTLLM_MARK in after:
            return trtllm_counters(self.trtllm[before[TRTLLM_MARK]:after[TRTLLM_MARK]])
        try:
            return diff(before, after)
        except CounterError as e:
            raise BackendError(f"GET {self.url}/metrics: {e} between two readings (the server restarted, or reset "
                               "its counters): no request's count") from None

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "server": self.server_kind, "version": self.version, "url": self.url,
                "config": self.config}

    def payload(self, request: TurnRequest) -> dict[str, Any]:
        """The request body of a turn."""
        body: dict[str, Any] = {"model": self.model, "stream": True, "stream_options": {"include_usage": True},
                                "max_tokens": request.max_new_tokens, "temperature": request.temperature,
                                "top_p": request.top_p, "return_token_ids": True}
        if request.seed is not None:
            body["seed"] = request.seed
        if request.top_k:
            body["top_k"] = request.top_k
        if self.server_kind == "llama.cpp":
            body.update(LLAMACPP_FIELDS)
        elif self.server_kind == "sglang":
            body.update(SGLANG_FIELDS)
        elif self.server_kind == TRTLLM:
            for key in TRTLLM_DROP:
                body.pop(key)
            if self.options["api"] == "completions":
                body.update(TRTLLM_COMPLETIONS_FIELDS)
        if self.options["api"] == "chat":
            body["messages"] = request.messages
        else:
            body["prompt"] = list(request.prompt_ids)
        return body

    def generate(self, request: TurnRequest) -> EngineTurn:
        """One turn: counters read, the request streamed, counters read again, all within ``timeout_s``."""
        deadline = time.monotonic() + self.timeout
        before = self._reading(deadline) if self.has_metrics else None
        turn, per_request = self.stream(request, deadline)
        sglang = sglang_steps(per_request["sglang"]) if "sglang" in per_request else None
        if sglang is not None:  # the request's own acceptance, which no other client can move
            for key, value in sglang.items():
                setattr(turn, key, value)
            turn.notes.append(f"acceptance from the server's per-request spec_tokens_details ({UNORDERED_STEPS})")
            return turn
        trtllm = None  # trtllm-serve's iterations during the request
        if before is None:
            turn.notes.append("no Prometheus counters at the server's /metrics: acceptance n/a")
            counters, iterations = dict.fromkeys(COUNTERS), None
        else:
            after = self.settled_reading(deadline)
            counters = self.counters_between(before[0], after[0])
            iterations = None if before[1] is None or after[1] is None else after[1] - before[1]
            if iterations is not None and iterations < 0:
                raise BackendError(f"GET {self.url}/metrics: the counter {ITERATIONS} went backwards, from "
                                   f"{before[1]} to {after[1]} between two readings (the server restarted, or reset "
                                   "its counters): no request's count")
            if TRTLLM_MARK in after[0]:
                trtllm = self.trtllm[before[0][TRTLLM_MARK]:after[0][TRTLLM_MARK]]
        turn.drafts, turn.draft_tokens = counters["drafts"], counters["draft_tokens"]
        turn.accepted_tokens, turn.accepted_per_pos = counters["accepted_tokens"], counters["accepted_per_pos"]
        totals = request_totals(per_request)
        if totals is not None:  # the request's own totals win over counter diffs (another client may move those)
            turn.draft_tokens, turn.accepted_tokens = totals
            turn.notes.append("drafted and accepted tokens from the server's per-request timings (draft_n, "
                              "draft_n_accepted)")
        accepted, drafted = per_request.get("per_step_accepted"), per_request.get("per_step_drafted")
        if isinstance(accepted, list) and isinstance(drafted, list) and len(accepted) == len(drafted):
            turn.accepted_steps, turn.drafted_steps = list(accepted), list(drafted)  # checked by stream()
            turn.notes.append("per-step acceptance from the server's per-request metrics")
        elif trtllm is not None and None not in (counters["drafts"], counters["draft_tokens"],
                                                 counters["accepted_tokens"]) and (
                counters["drafts"] > 0 or self.speculative):
            self._steps_from_trtllm(turn, trtllm)
        elif counters["drafts"] is not None and counters["accepted_per_pos"] is not None and (
                counters["drafts"] > 0 or self.speculative):
            self._steps_from_counters(turn)
        elif self.speculative and trtllm is not None:
            some = any(it.spec is not None for it in trtllm)
            raise BackendError(f"trtllm-serve at {self.url} reported no speculative decoding statistics for the turn "
                               f"at /metrics ({len(trtllm)} iterations, {'not all' if some else 'none'} with "
                               f"specDecodingStats' {', '.join(TRTLLM_FIELDS.values())}); start it with "
                               "enable_iter_perf_stats: true and speculative_config in its --config; a speculative "
                               "entry's forwards cannot be counted (an entry of method vanilla measures its tokens "
                               "and times)")
        elif self.speculative:
            raise BackendError(f"the server at {self.url} exposes no per-position acceptance counters at /metrics "
                               f"({', '.join(COUNTERS['drafts'] + COUNTERS['accepted_per_pos'])}) nor per-request "
                               "acceptance; a speculative entry's forwards cannot be counted (an entry of method "
                               "vanilla measures its tokens and times)")
        if turn.accepted_steps is not None and iterations is None:
            turn.notes.append("forwards derived from the steps: trtllm-serve's iterations are not read as forwards"
                              if trtllm is not None else "forwards derived from the steps: the server's /metrics "
                              "counts no engine iterations (vLLM's vllm:iteration_tokens_total)")
        turn.forwards = iterations
        return turn

    def _one_request(self, turn: EngineTurn, steps: list[int] | None, depth: int, moved: str) -> None:
        """A BackendError unless ``steps`` (accepted tokens per drafting step, None where the counters fit no
        steps) can be one request's: it yields 1 + Σ (accepted + 1) tokens over its drafting steps, at most
        ``depth`` (the deepest draft) past what it emitted. ``moved``: what the counters moved by, for the message."""
        n = turn.emitted() or 0
        if steps is None or 1 + len(steps) + sum(steps) > n + depth:
            raise BackendError(f"the counters at {self.url}/metrics moved by more than this request ({moved}, {n} "
                               "tokens): another client is using the server; measure at concurrency 1 on a server "
                               "of its own")

    def _steps_from_trtllm(self, turn: EngineTurn, iterations: list[TrtllmIteration]) -> None:
        """The turn's per-step accepted and drafted tokens from trtllm-serve's iterations during it, in order: one
        step per iteration whose ``numRequestsWithDraftTokens`` is 1 (at concurrency 1, this request's). A
        BackendError where they cannot be this request's alone: an iteration listed twice (one row per
        attention-DP rank), one that verified several requests' drafts, more tokens than the turn has (another
        client), or fewer (iterations missing from the reads: another reader of /metrics, such as trtllm-serve's
        own Prometheus collector with ``return_perf_metrics``, a full queue, ``iter_perf_stats_interval`` above
        1): each generation iteration yields 1 + its accepted tokens, the prefill 1."""
        ids = [it.iter for it in iterations if it.iter is not None]
        if len(set(ids)) != len(ids):
            raise BackendError(f"trtllm-serve at {self.url} listed an iteration more than once at /metrics "
                               f"(iterations {ids}): one row per attention-DP rank cannot be split by request; "
                               "measure a server of one rank")
        drafting = [it.spec for it in iterations if it.spec is not None and it.spec["drafts"]]
        if any(spec["drafts"] != 1 for spec in drafting):
            raise BackendError(f"trtllm-serve at {self.url} verified the drafts of several requests in one "
                               f"iteration ({[spec['drafts'] for spec in drafting]} per iteration): another client is "
                               "using the server; measure at concurrency 1 on a server of its own")
        steps = [spec["accepted_tokens"] for spec in drafting]
        depths = [spec["draft_tokens"] for spec in drafting]
        self._one_request(turn, steps, max(depths, default=0),
                          f"{len(steps)} drafting iterations accepting {sum(steps)} tokens")
        n = turn.emitted() or 0
        if all(it.gen_requests is not None for it in iterations):
            produced = 1 + sum(1 + (it.spec["accepted_tokens"] if it.spec is not None else 0)
                               for it in iterations if it.gen_requests)
            if produced < n:
                raise BackendError(f"trtllm-serve's iterations read at {self.url}/metrics account for {produced} of "
                                   f"the turn's {n} tokens: iterations are missing (another reader of /metrics, "
                                   "such as trtllm-serve's own collector with return_perf_metrics, a full queue "
                                   "(max_stats_len) or iter_perf_stats_interval above 1)")
        turn.accepted_steps, turn.drafted_steps = steps, depths
        turn.notes.append("per-step acceptance from trtllm-serve's iteration statistics (specDecodingStats), one "
                          "step per iteration that drafted")

    def _steps_from_counters(self, turn: EngineTurn) -> None:
        """The turn's per-step accepted and drafted tokens from its counters (vLLM's drafts and per position)."""
        drafts, per_pos = turn.drafts, turn.accepted_per_pos
        # a drafting step yields a token: more drafts than tokens are not this request's (and no list of that
        # many steps is built from a server's number)
        steps = steps_from_counters(drafts, per_pos) if drafts <= (turn.emitted() or 0) else None
        self._one_request(turn, steps, len(per_pos), f"{drafts} drafts, accepted per position {per_pos}")
        turn.accepted_steps = steps
        turn.notes.append(f"per-step acceptance from the server's counters ({UNORDERED_STEPS})")
        # every draft as deep as the per-position counter: acceptance at position i is then per_pos[i] / drafts,
        # vLLM's own convention; exact when the drafted tokens say every draft was that deep
        k = len(per_pos)
        turn.drafted_steps = [k] * len(steps)
        if turn.draft_tokens != k * drafts:
            turn.notes.append(f"draft depths: {k} per step assumed (the server drafted {turn.draft_tokens} "
                              f"tokens in {drafts} drafts)")

    def stream(self, request: TurnRequest, deadline: float | None = None) -> tuple[EngineTurn, dict[str, Any]]:
        """The streamed turn, and the server's per-request speculative metrics (vLLM's
        ``metrics.speculative_decoding`` on the usage chunk; {} where it sends none). Safe to call from several
        threads at once (a load level, :mod:`harness.run.load`): it reads no counters. ``deadline``
        (:func:`time.monotonic` seconds; default ``timeout_s`` from now) bounds the whole exchange.

        Measured, not believed: the turn's tokens are those that arrived (ids, or chunks of text), each id an
        integer within the target's vocabulary (``vocab``); the server's ``usage.completion_tokens`` is checked
        against them and against the request's budget, and every per-request count against the turn's tokens
        (:func:`checked_per_request`). A stream that goes past the budget is read no further and the turn is an
        error, not a turn cut to the budget: the server did not run the request it was sent (``max_tokens``), goes
        on generating after the harness stops reading, and its counters then hold tokens no record has, so its
        speed and acceptance would belong to another turn. Every failure is a BackendError naming the server (its
        password masked) and the field."""
        deadline = time.monotonic() + self.timeout if deadline is None else deadline
        path = APIS[self.options["api"]]
        what = f"POST {self.url}{path}"
        budget = request.max_new_tokens
        ids: list[int] = []
        text: list[str] = []
        times: list[float] = []
        chunk_times: list[float] = []  # arrival of each chunk of text without token ids
        notes: list[str] = []
        ttft = finish = usage = None
        per_request: dict[str, Any] = {}
        with_ids, prev, done = True, 0.0, False
        start = time.perf_counter()
        exchange = None
        try:
            exchange = Exchange("POST", self.endpoint + path, deadline, self.timeout,
                                 json.dumps(self.payload(request)).encode(),
                                 {"Content-Type": "application/json", "Accept": "text/event-stream"})
            response = exchange.response
            if response.status != 200:
                body = exchange.body(4096, cut=True).decode(errors="replace").strip().replace("\n", " ")
                raise BackendError(f"{what} answered HTTP {response.status} {response.reason}: {body[:200]}")
            for raw in exchange.lines(LINE_MAX_BYTES, STREAM_MAX_BYTES):
                try:
                    line = raw.decode().strip()
                except UnicodeDecodeError as e:
                    raise BackendError(f"{what} streamed a line that is not UTF-8 (byte {e.start}): "
                                       f"{raw[:80]!r}") from None
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                now = time.perf_counter() - start
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise BackendError(f"{what} streamed a line that is not JSON: {data[:120]!r}") from None
                if not isinstance(chunk, dict) or "error" in chunk:
                    err = chunk.get("error") if isinstance(chunk, dict) else chunk
                    raise BackendError(f"{what} sent an error mid-stream after {len(times)} tokens: "
                                       f"{json.dumps(err)[:200]}")
                if chunk.get("usage") is not None:
                    usage = checked_field(chunk["usage"], dict, "usage", what)
                verbose = chunk.get("__verbose")  # llama.cpp: a partial chunk's own token ids (the last's: [])
                verbose_ids = verbose.get("tokens") if isinstance(verbose, dict) else None
                metrics = chunk.get("metrics")
                if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
                    per_request = metrics["speculative_decoding"]
                if isinstance(chunk.get("timings"), dict):  # llama.cpp: the request's own, on the last chunk
                    per_request = {**per_request, "timings": chunk["timings"]}
                sglext = chunk.get("sglext")  # SGLang: the request's own statistics, in a chunk of their own
                if isinstance(sglext, dict) and isinstance(sglext.get("spec_tokens_details"), dict):
                    per_request = {**per_request, "sglang": sglext["spec_tokens_details"]}
                for choice in checked_field(chunk.get("choices") or [], list, "choices", what):
                    choice = checked_field(choice, dict, "choices[]", what)
                    key = "text" if "text" in choice else "delta.content"
                    piece = choice.get("text") if "text" in choice else checked_field(
                        choice.get("delta") or {}, dict, "choices[].delta", what).get("content")
                    if piece is not None:
                        checked_field(piece, str, f"choices[].{key}", what)
                    field = "token_ids" if choice.get("token_ids") else "__verbose.tokens"
                    new = self._token_ids(choice.get("token_ids") or verbose_ids, field, what)
                    if (new or piece) and ttft is None:  # the first chunk's tokens all arrive with it
                        ttft = prev = now
                    if new:
                        if len(ids) + len(new) > budget:
                            raise BackendError(f"{what} streamed more than the request's {budget} tokens (max_tokens): "
                                               f"{len(ids) + len(new)} token ids ({field}) had arrived; read no "
                                               "further (the server did not run the turn it was sent)")
                        ids += new
                        times += [prev + (now - prev) * (i + 1) / len(new) for i in range(len(new))]
                        if len(new) > 1 and not notes:
                            notes.append("chunks of several tokens: each chunk's time is split evenly over its "
                                         "tokens")
                    elif piece:
                        with_ids = False
                        if len(chunk_times) >= budget:  # every chunk of text holds at least one token
                            raise BackendError(f"{what} streamed more than the request's {budget} tokens "
                                               f"(max_tokens): {len(chunk_times) + 1} chunks of text ({key}) had "
                                               "arrived; read no further (the server did not run the turn it was "
                                               "sent)")
                        chunk_times.append(now)
                    if piece:
                        text.append(piece)
                    if new or piece:
                        prev = now
                    if choice.get("finish_reason"):
                        finish = checked_field(choice["finish_reason"], str, "choices[].finish_reason", what)
        except Late:
            arrived = len(ids) or len(chunk_times)
            if ttft is None and not arrived:
                raise BackendError(f"{what}: no answer within {self.timeout:g} s") from None
            raise BackendError(f"{what}: the turn was not over within {self.timeout:g} s (timeout_s bounds the whole "
                               f"turn) after {arrived} {'tokens' if ids else 'chunks'}") from None
        finally:
            if exchange is not None:
                exchange.close()
        wall = time.perf_counter() - start
        if not done or finish is None:
            missing = "no finish reason" if finish is None else "no [DONE]"
            raise BackendError(f"{what}: the stream ended mid-turn after {len(ids) or len(text)} "
                               f"{'tokens' if ids else 'chunks'} ({missing})")
        completion = None
        if usage is not None and usage.get("completion_tokens") is not None:
            completion = checked_count(usage["completion_tokens"], "usage.completion_tokens", what)
        with_ids = with_ids and bool(ids or not text)
        arrived = len(ids) if with_ids else len(chunk_times)
        if completion is not None and (completion > budget or completion < arrived):
            raise BackendError(f"{what}: the server claimed {completion} completion tokens (usage.completion_tokens), "
                               f"{arrived} arrived ({'token ids' if with_ids else 'chunks of text'}) for a budget of "
                               f"{budget}: its count is not the turn's")
        per_request = checked_per_request(per_request, completion if completion is not None else arrived, what)
        lost = with_ids and completion is not None and len(ids) != completion
        if with_ids and not lost:
            if completion is None:
                notes.append("no usage count from the server: the turn's length is the token ids that arrived")
            return EngineTurn(token_ids=ids, wall_time_s=wall, ttft_s=ttft, stop_reason=finish, text="".join(text),
                              completion_tokens=completion, token_times_s=times, notes=notes), per_request
        if completion is None:
            raise BackendError(f"{what} sent text without token ids and no usage count: the turn's tokens cannot "
                               "be counted")
        per_token = not lost and len(chunk_times) == completion  # as many chunks as tokens: one per chunk
        # llama.cpp sends no chunk for a token that ends inside a UTF-8 character: its id is lost
        why = (f"the chunks carried {len(ids)} token ids for the server's {completion} tokens" if lost else
               "text without token ids")
        notes = [why + ": output_ids n/a (losslessness n/a), the turn's length is the server's own count, " + (
            "one token per chunk" if per_token else "token times n/a (chunks are not tokens)")]
        return EngineTurn(token_ids=None, wall_time_s=wall, ttft_s=ttft, stop_reason=finish, text="".join(text),
                          completion_tokens=completion, token_times_s=chunk_times if per_token else None,
                          notes=notes), per_request

    def _token_ids(self, new: Any, field: str, what: str) -> list[int]:
        """A chunk's token ids, checked: a list of integers (not floats, not booleans) within the target's
        vocabulary (0 to ``vocab`` - 1; any integer >= 0 where the vocabulary is unknown)."""
        if not new:
            return []
        for t in checked_field(new, list, field, what):
            if isinstance(t, bool) or not isinstance(t, int):
                raise BackendError(f"{what} streamed the token id {str(t)[:40]} ({field}), not an integer")
            if t < 0 or (self.vocab is not None and t >= self.vocab):
                raise BackendError(f"{what} streamed the token id {t} ({field}), outside the target's vocabulary "
                                   f"(0 to {self.vocab - 1 if self.vocab is not None else 'any'})")
        return new

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
