"""A fake OpenAI-compatible server for the served-engine tests (harness/backends/served.py): standard library only,
in a thread (:func:`serve`) or as a process (``python fake_openai_server.py PORT MODE``, for the launch tests).

It serves ``/health``, ``/version``, ``/v1/models`` (model ``smollm2-135m``), ``/metrics`` (vLLM's speculative
counters, which each request advances by 2 drafts of 2 tokens, 3 accepted: 2 at position 0, 1 at position 1) and
streams ``/v1/chat/completions`` and ``/v1/completions`` as server-sent events: token ids 10, 11, ... up to the
request's ``max_tokens``, one per chunk, each with its text ``t10 ``, then a chunk with ``finish_reason: length``
and the usage, then ``[DONE]``.

``mode`` (``Fake.mode``, comma-separated) makes it misbehave: ``not_ready`` (/health answers 503), ``status=N`` (the
completion answers HTTP N), ``hang`` (the completion answers after 5 s), ``no_counters`` (/metrics without the
speculative counters), ``cut_at=N`` (the stream closes after N tokens, without finish or ``[DONE]``),
``model=NAME`` (serves another model), ``text_only`` (no token ids), ``pairs`` (two token ids per chunk),
``error_at=N`` (an error object in the stream after N tokens), ``per_request`` (vLLM's per-request acceptance,
``metrics.speculative_decoding`` with steps accepting 1 then 2 tokens, on the usage chunk), ``llamacpp`` (as
llama.cpp's ``llama-server --metrics`` answers, from payloads captured live from commit 0c1e570 and trimmed: no
``/version`` but ``/props``' ``build_info`` and ``total_slots``, 4 as the build makes when not told, or
``slots=N``; ``llamacpp:`` counters, the per-position one only once it has drafted;
no ``token_ids``, but with the request's ``verbose`` each /v1/completions chunk's own id in ``__verbose.tokens``;
the usage on the finishing chunk), ``lost_at=N`` (with ``llamacpp``: no chunk for token N, as llama.cpp sends
none for a token that ends inside a UTF-8 character), ``timings`` (with ``llamacpp``: the finishing chunk carries
the request's ``timings`` with ``draft_n`` 4 and ``draft_n_accepted`` 2, the second not what the counters moved by;
``timings=no_draft``: without those two, as llama-server sends them only for a request that drafted), ``sglang``
(as SGLang 0.5.23's server answers, shapes from its source, not captured live: no ``/version`` but
``/server_info``' ``version``; ``sglang:`` metrics without speculative counters; with the request's
``return_spec_tokens_details`` a chunk without choices before the usage carrying ``sglext.spec_tokens_details``:
3 verification forwards of 3 drafted tokens, accepting 2, 2 and 0), ``trtllm`` (as ``trtllm-serve`` of
NVIDIA/TensorRT-LLM answers, shapes from its source, not run here: requests with a field it does not declare,
``return_token_ids`` among them, answer HTTP 400; with ``detokenize: false`` each /v1/completions chunk carries
``token_ids`` and empty text, chat chunks text only; ``/metrics`` is the JSON array of the engine iterations since
the previous read, which the read removes (:func:`trtllm_iteration`): per request a prefill iteration, then
generation iterations each drafting 2 tokens, accepting 1, then 2, 2, ... until the request's ``max_tokens``;
``trtllm=vanilla``: ``specDecodingStats`` null, one token per iteration; with ``no_stats`` ``/metrics`` is always
``[]`` (a server without ``enable_iter_perf_stats``), with ``bad_json`` it is cut short mid-array, with ``stolen``
each request's last iteration is missing, as when another reader drained it first); as a process also
``exit`` (exits with code 3 before serving) and ``spawn`` (starts a child, as vLLM starts its engine process, and
writes its pid to ``$FAKE_CHILD_PID``: stopping the server must stop it too).

Hostile modes, each an attack the served client must measure rather than believe (harness/backends/served.py):
``claim=V`` (the usage's ``completion_tokens`` is V, as JSON: ``100000``, ``8.5``, ``true``), ``no_usage`` (no usage
chunk), ``over=N`` (N tokens streamed past the request's ``max_tokens``), ``bad_id=V`` (the second token's id is
V, as JSON: ``10.7``, ``true``, ``-1``, ``100000``), ``bad_utf8`` (raw bytes that are not UTF-8 in the second chunk),
``long_line=N`` (an SSE comment line of N bytes before the first token), ``drip=S`` (one chunk every S s),
``drip_health=S`` (``/health`` announces 60 bytes and sends one every S s), ``backwards`` (the drafts counter falls
by 2 with every request, as after a restart), ``counter=V`` (the drafts counter printed as V: ``NaN``, ``-3``),
``position=N`` (a per-position sample at position N), ``big_metrics=N`` (``/metrics`` N bytes longer, in comment
lines), ``hist=N`` (with ``sglang``: N forwards that accepted 2 drafts in the histogram, against 3 verifications),
``finish=V`` (the finish reason is V, as JSON: ``7``), ``draft_n=V`` (with ``llamacpp,timings``: the timings'
``draft_n`` is V, as JSON: ``NaN``), ``step=V`` (with ``per_request``: the second step accepted V, as JSON: ``2.5``).
Every request's headers are kept (``Fake.headers``).

For load levels (harness/run/load.py) it serves requests concurrently and can act as a batching engine:
``step_ms=S`` makes every decoding step of a request take :func:`step_seconds` (S ms for a batch of one sequence,
plus ``batch_cost=F`` of that per token verified in the batch: every request in flight verifies 1 token a step, or
K + 1 with ``spec=K``); ``spec=K`` drafts K tokens a step of which ``accept=A`` (default K) are accepted, so each
step streams one chunk of A + 1 tokens and advances the counters by one draft of K, A accepted. Speculation then
pays while the batch is small and stops paying as it grows (:func:`step_seconds`).
"""

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The fields /v1/completions of trtllm-serve declares (CompletionRequest in tensorrt_llm/serve/openai_protocol.py at
# 0076e93; its OpenAIBaseModel has extra="forbid"), and "messages" for /v1/chat/completions: any other is HTTP 400
TRTLLM_REQUEST_FIELDS = {
    "model", "prompt", "messages", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
    "lora_request", "prompt_ignore_length", "use_beam_search", "top_k", "top_p_min", "min_p", "repetition_penalty",
    "length_penalty", "early_stopping", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens", "return_context_logits",
    "detokenize", "thinking_token_budget", "add_special_tokens", "response_format", "disaggregated_params", "priority",
    "conversation_params"}


def trtllm_iteration(it: int, context: int, generation: int, drafted: int | None, accepted: int) -> dict:
    """One engine iteration as trtllm-serve's ``/metrics`` lists it, at concurrency 1: keys, nesting and order as
    ``_iteration_report`` and ``_materialize_frame`` build them (tensorrt_llm/executor/iteration_stats.py at
    b117901), the speculative counts summed over the iteration's generation requests as ``_update_iter_stats``
    does (tensorrt_llm/_torch/pyexecutor/py_executor.py). ``context`` / ``generation``: requests in either phase
    this iteration; ``drafted``: tokens the generation request drafted, or None for a server without speculation
    (``specDecodingStats`` null). The other values are plausible, not captured (the timestamp's format is not
    settled by the source; draftbench reads none of them)."""
    spec = None
    if drafted is not None:
        requests = int(drafted > 0)
        spec = {"numDraftTokens": drafted, "numAcceptedTokens": accepted, "numRequestsWithDraftTokens": requests,
                "acceptanceLength": (accepted + requests) / requests if requests else 0.0, "iterLatencyMS": 0.0,
                "draftOverhead": 0.0}
    return {
        "timestamp": "05-14-2026 10:00:00", "iter": it, "iterLatencyMS": 7.0, "newActiveRequestsQueueLatencyMS": 0.0,
        "numNewActiveRequests": context, "numActiveRequests": 1, "numQueuedRequests": 0, "numCompletedRequests": 0,
        "maxNumActiveRequests": 2048, "maxBatchSizeStatic": 0, "maxBatchSizeTunerRecommended": 0,
        "maxBatchSizeRuntime": 0, "maxNumTokensStatic": 0, "maxNumTokensTunerRecommended": 0,
        "maxNumTokensRuntime": 0, "gpuMemUsage": 76665782272, "cpuMemUsage": 0, "pinnedMemUsage": 0,
        "kvCacheStats": {"maxNumBlocks": 101256, "freeNumBlocks": 101253, "usedNumBlocks": 3, "tokensPerBlock": 32,
                         "allocTotalBlocks": 3, "allocNewBlocks": 3, "reusedBlocks": 0, "missedBlocks": 1,
                         "cacheHitRate": 0.0},
        "staticBatchingStats": {"numScheduledRequests": 0, "numContextRequests": 0, "numCtxTokens": 0,
                                "numGenTokens": 0, "emptyGenSlots": 0},
        "inflightBatchingStats": {"numScheduledRequests": context + generation, "numContextRequests": context,
                                  "numGenRequests": generation, "numPausedRequests": 0,
                                  "numCtxTokens": 3 * context, "microBatchId": 0, "avgNumDecodedTokensPerIter": 0.0,
                                  "numCtxKvTokens": 0, "numGenKvTokens": 0, "numQueuedContextRequests": 0,
                                  "numQueuedCtxTokens": 0, "numQueuedGenRequests": 0, "numQueuedGenKvTokens": 0,
                                  "numPausedKvTokens": 0},
        "specDecodingStats": spec, "schedulerMode": "overlap", "statsSequence": it, "statsDroppedFrames": 0,
        "attentionDpRank": 0}


def step_seconds(step_s: float, batch_cost: float, in_flight: int, verified: int) -> float:
    """One decoding step of a batching engine: ``step_s`` for one sequence, plus ``batch_cost`` of it per token the
    batch verifies (``in_flight`` requests, each ``verified`` tokens: 1 without speculation, K + 1 with K drafted).
    A request's speed-up from speculation is then (A + 1) (1 + F c) / (1 + F c (K + 1)) at concurrency c: with
    K = 3, A = 1, F = 0.05: 2 x 1.05 / 1.2 = 1.75 at c = 1, 1.33 at 4, 0.857 at 16 (it stops paying between 4 and 16).
    Example: (0.01, 0.05, 16, 4) -> 0.01 x (1 + 0.05 x 64) = 0.042."""
    return step_s * (1 + batch_cost * in_flight * verified)


class Fake:
    """What the server does and saw: ``mode``, the request bodies it got (``requests``) and its counters."""

    def __init__(self, mode: str = ""):
        self.mode = mode
        self.requests: list[dict] = []
        self.headers: list[dict] = []  # the headers of every request (basic authentication)
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_pos = [0, 0]
        self.in_flight = 0
        self.iterations: list[dict] = []  # trtllm: the iterations queued since /metrics was last read
        self.iter = 0
        self.lock = threading.Lock()

    def flag(self, name: str) -> str | None:
        for part in self.mode.split(","):
            key, _, value = part.partition("=")
            if key == name:
                return value or "1"
        return None

    def claim(self, n: int):
        """The usage's completion_tokens of a turn of ``n`` tokens: ``n``, or with ``claim=V`` V (JSON: 100000,
        8.5, true...)."""
        return json.loads(self.flag("claim")) if self.flag("claim") else n

    def queue_trtllm(self, n: int) -> None:
        """trtllm: queue one request's iterations, ``n`` tokens: the prefill's (its first token), then generation
        iterations drafting 2 tokens and accepting 1, then 2, 2, ... (or, with ``trtllm=vanilla``, one token each)
        until the request has its tokens; with ``stolen`` the last is not queued."""
        spec = self.flag("trtllm") != "vanilla"
        rows, made = [(1, 0, 0 if spec else None, 0)], 1
        while made < n:
            accepted = (1 if len(rows) == 1 else 2) if spec else 0
            rows.append((0, 1, 2 if spec else None, accepted))
            made += 1 + accepted
        with self.lock:
            for context, generation, drafted, accepted in rows[:-1] if self.flag("stolen") else rows:
                self.iter += 1
                self.iterations.append(trtllm_iteration(self.iter, context, generation, drafted, accepted))

    def metrics(self) -> str:
        if self.flag("trtllm"):
            if self.flag("bad_json"):
                return '[{"iter": 3, "iterLatencyMS": 7.0,'
            with self.lock:  # every read takes what is queued
                taken, self.iterations = self.iterations, []
            return json.dumps([] if self.flag("no_stats") else taken)
        if self.flag("sglang"):
            return ("# TYPE sglang:generation_tokens_total counter\n"
                    'sglang:generation_tokens_total{model_name="smollm2-135m",is_streaming="true"} 14.0\n'
                    'sglang:spec_accept_length{model_name="smollm2-135m"} 2.0\n')
        if self.flag("llamacpp"):
            lines = ["# TYPE llamacpp:tokens_predicted_total counter", "llamacpp:tokens_predicted_total 14"] + [
                f"llamacpp:spec_decode_num_{name}_total {value}" for name, value in
                (("draft_tokens", self.draft_tokens), ("accepted_tokens", self.accepted), ("drafts", self.drafts))]
            if self.drafts:
                lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}'
                          for i, v in enumerate(self.per_pos)]
            return "\n".join(lines) + "\n"
        lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
                 "# TYPE vllm:num_requests_running gauge", 'vllm:num_requests_running{engine="0"} 0.0']
        if not self.flag("no_counters"):
            # counter=V: the drafts counter printed as V (NaN, -3...); backwards: it falls by 2 with every request
            drafts = self.flag("counter") or f"{100 - self.drafts if self.flag('backwards') else self.drafts}.0"
            lines += ["# TYPE vllm:spec_decode_num_drafts counter",
                      f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="smollm2-135m"}} {drafts}',
                      f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {self.draft_tokens}.0',
                      f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {self.accepted}.0',
                      'vllm:spec_decode_num_accepted_tokens_created{engine="0"} 1.7e+09'] + [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {v}.0'
                for i, v in enumerate(self.per_pos)]
            if self.flag("position"):  # a position label far past any draft
                lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",'
                             f'position="{self.flag("position")}"}} 1.0')
        if self.flag("big_metrics"):  # a body of that many more bytes, in comment lines of 1 KiB
            lines += ["# " + "x" * 1021] * (int(self.flag("big_metrics")) // 1024 + 1)
        return "\n".join(lines) + "\n"


def handler(fake: Fake):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def reply(self, status: int, body: str, kind: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            fake.headers.append(dict(self.headers))
            try:
                self.get()
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a dripped answer)
                pass

        def get(self):
            if self.path == "/health" and fake.flag("drip_health"):  # 60 bytes announced, one every S s
                self.send_response(200)
                self.send_header("Content-Length", "60")
                self.end_headers()
                for _ in range(60):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(float(fake.flag("drip_health")))
            elif self.path == "/health":
                self.reply(503 if fake.flag("not_ready") else 200, "")
            elif self.path == "/version" and not (fake.flag("llamacpp") or fake.flag("sglang")):
                self.reply(200, json.dumps({"version": "0.0-fake"}))
            elif self.path == "/props" and fake.flag("llamacpp"):
                self.reply(200, json.dumps({"build_info": "b1-0c1e570", "model_path": "/m.gguf",
                                            "total_slots": int(fake.flag("slots") or 4)}))
            elif self.path == "/server_info" and fake.flag("sglang"):
                self.reply(200, json.dumps({"version": "0.5.23", "frontend": "python", "tp_size": 1}))
            elif self.path == "/v1/models":
                self.reply(200, json.dumps({"object": "list", "data": [
                    {"id": fake.flag("model") or "smollm2-135m", "object": "model"}]}))
            elif self.path == "/metrics":
                self.reply(200, fake.metrics(), "application/json" if fake.flag("trtllm") else
                           "text/plain; version=0.0.4")
            else:
                self.reply(404, json.dumps({"detail": "Not Found"}))

        def do_POST(self):
            fake.headers.append(dict(self.headers))
            try:
                self.post()
            except (BrokenPipeError, ConnectionResetError):  # the client stopped reading (over budget, too long)
                pass

        def post(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.requests.append(body)
            extra = sorted(set(body) - TRTLLM_REQUEST_FIELDS) if fake.flag("trtllm") else []
            if extra:  # FastAPI's RequestValidationError, as trtllm-serve's handler answers it
                self.reply(400, json.dumps({"error": str([
                    {"type": "extra_forbidden", "loc": ("body", key), "msg": "Extra inputs are not permitted",
                     "input": body[key]} for key in extra])}))
                return
            status = fake.flag("status")
            if status:
                self.reply(int(status), json.dumps({"error": {"message": f"fake error {status}"}}))
                return
            if fake.flag("hang"):
                time.sleep(5)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            chat = self.path == "/v1/chat/completions"
            n, cut, error = body["max_tokens"] + int(fake.flag("over") or 0), fake.flag("cut_at"), fake.flag("error_at")
            spec = int(fake.flag("spec") or 0)
            accept = int(fake.flag("accept") or spec)
            step = accept + 1 if spec else 2 if fake.flag("pairs") else 1
            step_ms = fake.flag("step_ms")
            with fake.lock:
                fake.in_flight += 1
            try:
                self.stream(fake, body, chat, n, cut, error, step, spec, accept, step_ms)
            finally:
                with fake.lock:
                    fake.in_flight -= 1

        def stream(self, fake, body, chat, n, cut, error, step, spec, accept, step_ms):
            if chat:
                self.event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            if fake.flag("long_line"):  # a comment line of that many bytes, sent in pieces, then its newline
                left = int(fake.flag("long_line"))
                self.wfile.write(b":")
                while left > 0:
                    self.wfile.write(b"x" * min(left, 1 << 16))
                    left -= 1 << 16
                self.wfile.write(b"\n\n")
            for i in range(0, n, step):
                if fake.flag("drip"):  # one chunk every S s, however long the turn's deadline
                    time.sleep(float(fake.flag("drip")))
                if cut is not None and i >= int(cut):
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if error is not None and i >= int(error):
                    self.event({"error": {"message": "fake engine crashed", "code": 500}})
                    break
                ids = list(range(10 + i, 10 + min(i + step, n)))
                if i == 1 and fake.flag("bad_id"):  # the second token's id: a float, a boolean, past the vocabulary
                    ids = [json.loads(fake.flag("bad_id"))]
                text = "".join(f"t{t} " for t in ids)
                choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                if fake.flag("trtllm"):  # ids only for /v1/completions with detokenize: false, then no text
                    if not chat and body.get("detokenize") is False:
                        choice.update(text="", token_ids=ids)
                    self.event({"choices": [choice]})
                    continue
                if fake.flag("llamacpp"):
                    if str(i) != fake.flag("lost_at"):
                        self.event({"choices": [choice], "object": "text_completion", **(
                            {"__verbose": {"content": text, "tokens": ids, "stop": False}}
                            if body.get("verbose") and not chat else {})})
                    continue
                if not fake.flag("text_only"):
                    choice["token_ids"] = ids
                if i == 1 and fake.flag("bad_utf8"):  # raw bytes that are not UTF-8 inside the chunk's text
                    self.wfile.write(b"data: " + json.dumps({"choices": [choice]}).replace(
                        text, text + "@").encode().replace(b"@", b"\xff\xfe") + b"\n\n")
                    continue
                if step_ms:  # a batching engine: the step costs more the more the batch verifies
                    with fake.lock:
                        busy = fake.in_flight
                    time.sleep(step_seconds(float(step_ms) / 1000, float(fake.flag("batch_cost") or 0), busy,
                                            spec + 1))
                    if spec:
                        with fake.lock:
                            fake.drafts, fake.draft_tokens, fake.accepted = (fake.drafts + 1, fake.draft_tokens + spec,
                                                                             fake.accepted + accept)
                            fake.per_pos = [(fake.per_pos[j] if j < len(fake.per_pos) else 0) + int(j < accept)
                                            for j in range(max(spec, len(fake.per_pos)))]
                self.event({"choices": [choice]})
                if not step_ms:
                    time.sleep(0.001)
            else:
                if fake.flag("trtllm"):
                    fake.queue_trtllm(n)
                if not step_ms:
                    with fake.lock:
                        fake.drafts, fake.draft_tokens = fake.drafts + 2, fake.draft_tokens + 4
                        fake.accepted += 3
                        fake.per_pos = [fake.per_pos[0] + 2, fake.per_pos[1] + 1]
                last = {"index": 0, "finish_reason": json.loads(fake.flag("finish") or '"length"'),
                        **({"delta": {}} if chat else {"text": ""})}
                if fake.flag("llamacpp"):  # the finishing chunk carries the usage; its own tokens are []
                    final = {"choices": [last], "usage": {"completion_tokens": fake.claim(n), "prompt_tokens": 3},
                             "__verbose": {"content": "", "tokens": [], "stop": True}}
                    if fake.flag("timings"):  # the request's own timings; draft_n only where it drafted
                        final["timings"] = {"cache_n": 0, "prompt_n": 3, "prompt_ms": 1.5, "predicted_n": n,
                                            "predicted_ms": 6.0, **({"draft_n": json.loads(fake.flag("draft_n") or "4"),
                                                                     "draft_n_accepted": 2}
                                                                    if fake.flag("timings") != "no_draft" else {})}
                    self.event(final)
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                    return
                self.event({"choices": [last]})
                if fake.flag("sglang") and body.get("return_spec_tokens_details"):
                    self.event({"object": "text_completion", "choices": [], "model": body["model"], "sglext": {
                        "routed_experts": None, "cached_tokens_details": None, "spec_tokens_details": {
                            "spec_accept_rate": 4 / 9, "spec_accept_length": n / 3, "spec_num_correct_drafts": 4,
                            "spec_num_proposed_drafts": 9, "spec_verify_ct": 3,
                            "spec_correct_drafts_histogram": [1, 0, int(fake.flag("hist") or 2)],
                            "spec_cap_lens_histogram": []}}})
                usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": fake.claim(n)}}
                if fake.flag("per_request"):
                    usage["metrics"] = {"speculative_decoding": {
                        "mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.75, "acceptance_histogram": [0, 1, 1],
                        "num_spec_steps": 2, "num_accepted_draft_tokens": 3, "num_draft_tokens": 4,
                        "num_spec_tokens": 2, "per_step_accepted": [1, json.loads(fake.flag("step") or "2")],
                        "per_step_drafted": [2, 2]}}
                if not fake.flag("no_usage"):
                    self.event(usage)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def event(self, obj: dict) -> None:
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

    return Handler


def serve(fake: Fake, port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Serve ``fake`` in a daemon thread; (server, its URL). Stop it with ``server.shutdown()``."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler(fake))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main() -> int:
    port, mode = int(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "")
    fake = Fake(mode)
    if fake.flag("exit"):
        print("fake server: cannot load the model", flush=True)
        return 3
    if fake.flag("spawn"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(os.environ["FAKE_CHILD_PID"], "w") as f:
            f.write(str(child.pid))
    server = ThreadingHTTPServer(("127.0.0.1", port), handler(fake))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
