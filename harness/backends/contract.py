"""The backend contract: what a run asks of an engine other than the harness's own, and what one turn gives back.

A backend is built once per method entry (target, method and its options, ``engine_options``) and then asked for
one turn at a time (:class:`TurnRequest` -> :class:`EngineTurn`). It returns what the harness's own records hold
where the engine exposes it: the new token ids, the turn's wall time, the time to the first token, and the
speculative counters (drafts, drafted tokens, accepted tokens, accepted per draft position). A counter the engine
does not expose is None ("n/a"), never 0: a missing counter must not read as zero acceptance.

The prompt travels twice: as chat ``messages`` (for engines that apply their own chat template, e.g. a served chat
endpoint) and as ``prompt_ids``, the harness's own rendering of the same messages. An in-process engine takes the
ids, so the harness and the engine see the same tokens and their greedy outputs can be held against each other.

A served engine may return text without token ids (then ``token_ids`` is None, the record's ``output_ids`` is null
and the losslessness check is n/a for the turn, never a pass), per-chunk rather than per-token times, or counters
but no per-step acceptance; ``notes`` says which, and every record carries them (``engine_notes``).
"""

from __future__ import annotations

import abc
import itertools
from dataclasses import dataclass, field
from typing import Any

from harness.schema import InputError

# "harness": the verification engine of harness/engine (no backend object); "openai": any OpenAI-compatible server
ENGINES = ("harness", "vllm", "openai")


class EngineError(InputError):
    """An engine configuration the backend cannot run (unknown engine, a method or option it has no equivalent
    for); the message names what the engine supports."""


class BackendError(OSError):
    """A backend that failed while running (did not start, died, answered garbage or an error): one line saying
    which and why. The turn it happened in becomes an error record; before the run starts, the command prints it as
    one line (an OSError, like a refused connection)."""


@dataclass(frozen=True)
class EnginePlan:
    """A method entry's engine, checked once before anything loads (:func:`harness.backends.check_engine`), with
    what the engine needs of the entry derived once: ``speculative``, vLLM's ``speculative_config`` (engine ``vllm``,
    or a ``vllm serve`` that engine ``openai`` launches; None: no speculation); ``served``, engine ``openai``'s own
    options with their defaults (:func:`harness.backends.served.check_options`); ``speculates``, whether the entry's
    turns speculate. ``options``: the method's options dataclass; ``given``: the option names the run set."""

    engine: str
    method: str
    options: Any
    given: frozenset[str]
    target: str
    engine_options: dict[str, Any]
    speculative: dict[str, Any] | None = None
    served: dict[str, Any] | None = None
    speculates: bool = False


@dataclass
class TurnRequest:
    """One turn: the conversation so far (``messages``, ending with the user's turn), the harness's token ids of it
    rendered with the run's chat template and system prompt, sampling and the token budget."""

    messages: list[dict[str, str]]
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None


@dataclass
class EngineTurn:
    """What a backend measured for one turn. Counters: the engine's own, for this turn only; None where the engine
    has no such counter. ``accepted_per_pos[i]``: drafts whose first i + 1 tokens were accepted.
    ``accepted_steps`` / ``drafted_steps``: per verification step that drafted, the accepted and drafted tokens,
    where the engine reports steps (then :func:`accept_lengths` derives draftbench's per-forward counts).
    ``forwards``: the turn's target forwards (the prefill counted once), where the engine counts them.
    ``token_ids``: None when the engine returned only ``text`` (then ``completion_tokens``, its own count, is the
    turn's length). ``token_times_s``: per new token, seconds from the request to its arrival, where the engine
    streams. ``notes``: how this turn was measured where it departs from the harness's own (one phrase each)."""

    token_ids: list[int] | None
    wall_time_s: float
    ttft_s: float | None = None
    stop_reason: str | None = None
    drafts: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    accepted_per_pos: list[int] | None = None
    accepted_steps: list[int] | None = None
    drafted_steps: list[int] | None = None
    forwards: int | None = None
    text: str | None = None
    completion_tokens: int | None = None
    token_times_s: list[float] | None = None
    notes: list[str] = field(default_factory=list)

    def emitted(self) -> int | None:
        """The turn's new tokens: its token ids, else the engine's own count (None when it gave neither)."""
        return len(self.token_ids) if self.token_ids is not None else self.completion_tokens

    def counters(self) -> dict[str, Any]:
        """The acceptance counters as a record stores them (``engine_counters``)."""
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "accepted_per_pos": self.accepted_per_pos}


def accept_lengths(accepted_steps: list[int] | None, new_tokens: int, speculative: bool,
                   forwards: int | None = None) -> list[int] | None:
    """draftbench's ``accept_lengths`` (tokens per target forward, :class:`harness.engine.method.Generation`) from
    an engine's per-step accepted counts: the prefill's token, then accepted + 1 per drafting step, then one token
    for each forward that drafted nothing (engines report only drafting steps, so those go last), the total being
    the turn's ``new_tokens``. Without speculation every forward gives one token; speculating without step counts
    gives None (not derivable).

    The last drafting step's accepted tokens can run past the budget or EOS (vLLM counts tokens it then drops).
    With the engine's count of the turn's ``forwards`` (prefill once), the forwards that drafted nothing are
    ``forwards - 1 - steps`` and the last drafting step keeps what is left; without it (or when that count does not
    fit the steps), the steps are taken whole in order and the rest are forwards that drafted nothing, which
    undercounts them when the last step ran past the budget.

    Examples: ([2, 0, 1], 7) -> [1, 3, 1, 2]; ([2, 0, 1], 9) -> [1, 3, 1, 2, 1, 1]; ([2, 0, 1], 5) -> [1, 3, 1];
    ([2], 2) -> [1, 1]; (None, 3, speculative=False) -> [1, 1, 1]; ([4, 2], 8) -> [1, 5, 2] but
    ([4, 2], 8, forwards=4) -> [1, 5, 1, 1] (the last step accepted 2, one token fit the budget, and a forward
    that drafted nothing came between).
    """
    if not speculative:
        return [1] * new_tokens
    if accepted_steps is None:
        return None
    whole = [a + 1 for a in accepted_steps]  # tokens of each drafting step, taken whole
    if forwards is not None and whole:
        plain = forwards - 1 - len(whole)
        last = new_tokens - 1 - sum(whole[:-1]) - plain
        if plain >= 0 and 1 <= last <= whole[-1]:
            return [1] + whole[:-1] + [last] + [1] * plain
    out, left = [], new_tokens
    for n in [1] + whole:
        if left <= 0:
            break
        out.append(min(n, left))
        left -= out[-1]
    return out + [1] * left


def entry_options(options: dict[str, Any], backend: Backend | None) -> dict[str, Any]:
    """The options an entry's manifest and records show (``method_options``, the summary's ``opt.*`` columns): the
    method's own ``options``, or what its backend ran instead (:attr:`Backend.ran_options`), so that a server's
    entry never shows the harness method's defaults as if the server had run them.
    Example: ({"max_ngram": 3}, a llama-server started with spec_type ngram-simple) -> {"spec_type": "ngram-simple"}."""
    if backend is None or backend.ran_options is None:
        return options
    return dict(backend.ran_options)


def steps_from_counters(drafts: int, accepted_per_pos: list[int]) -> list[int] | None:
    """Per drafting step, the accepted draft tokens, from a turn's counters alone: ``drafts`` D and
    ``accepted_per_pos`` p[0..k-1] (p[i]: drafts whose first i + 1 tokens were accepted) fix how many steps accepted
    exactly j tokens: D - p[0] for j = 0, p[j-1] - p[j] for 0 < j < k, p[k-1] for j = k. Their order is not in the
    counters: listed from most to fewest accepted. None when the counters contradict a chain (p rising with the
    position, p[0] > D, a negative count).

    Examples: (4, [3, 1]) -> [2, 1, 1, 0]; (2, [0, 0, 0]) -> [0, 0]; (0, []) -> []; (1, [0, 1]) -> None.
    """
    p = list(accepted_per_pos)
    if drafts < 0 or any(x < 0 for x in p) or (p and p[0] > drafts) or any(b > a for a, b in itertools.pairwise(p)):
        return None
    # exact[j]: steps that accepted exactly j tokens, j = 0..k
    exact = [drafts - (p[0] if p else 0)] + [a - b for a, b in itertools.pairwise([*p, 0])]
    return [j for j in range(len(exact) - 1, -1, -1) for _ in range(exact[j])]


class Backend(abc.ABC):
    """An engine that runs one method entry's turns. ``name``: the engine (``vllm``); :meth:`describe`: its name,
    version and configuration, for the manifest and every record; :meth:`close` stops whatever it started (also
    after a failure)."""

    name: str = ""
    speculative: bool = False
    engine_options: dict[str, Any] = {}  # what the entry passes to the engine (set by create_backend), recorded
    # what the engine ran in place of the method's options (a server configured by its own flags or configuration),
    # the entry's recorded method_options (:func:`entry_options`); None: the method's options ran as they are
    ran_options: dict[str, Any] | None = None

    @abc.abstractmethod
    def generate(self, request: TurnRequest) -> EngineTurn: ...

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def close(self) -> None: ...


STOP_REASONS = {"stop": "eos", "length": "max_new_tokens"}  # an engine's finish reason -> the records' stop_reason

# where an engine's acceptance figures come from and what they count (the records' ``engine_acceptance``, the
# summary's ``acceptance_from``), keyed by (engine, server kind); the harness counts every verification step itself
ACCEPTANCE_SOURCES = {
    ("vllm", None): "vLLM's spec-decode counters diffed around the turn: drafting steps only, per position in order",
    ("openai", "vllm"): "the server's vllm:spec_decode_* counters diffed around the request: drafting steps only, "
                        "per position in order",
    ("openai", "sglang"): "SGLang's per-request spec_tokens_details: every verification forward, accepted drafts "
                          "as a histogram",
    ("openai", "llama.cpp"): "llama.cpp's llamacpp:spec_decode_* counters diffed around the request: drafts and "
                             "accepted totals, per position not in step order",
    ("openai", "trtllm-serve"): "trtllm-serve's /metrics iterations read around the request: one step per iteration "
                                "that drafted, per position n/a",
}


def acceptance_source(engine: str, server: str | None) -> str:
    """What an engine's acceptance counts, in one phrase, for the tables (:data:`ACCEPTANCE_SOURCES`).

    Examples: ("vllm", None) -> "vLLM's spec-decode counters diffed ..."; ("openai", "sglang") -> "SGLang's
    per-request spec_tokens_details: ..."; ("openai", None) (a server of unknown kind) -> "the server's own
    counters (server kind unknown)"."""
    return ACCEPTANCE_SOURCES.get((engine, server if engine == "openai" else None),
                                  f"the server's own counters (server kind {server or 'unknown'})")


def engine_fields(backend: Backend, speculated: bool) -> dict[str, Any]:
    """Which engine ran a turn or a load level (a record's and a load row's ``engine``, ``engine_version``,
    ``engine_url``, ``engine_config``) and what its acceptance counts (``engine_acceptance``,
    :func:`acceptance_source`; None when it did not speculate)."""
    info = backend.describe()
    return {"engine": backend.name, "engine_version": info.get("version"), "engine_url": info.get("url"),
            "engine_config": info.get("config"),
            "engine_acceptance": acceptance_source(backend.name, info.get("server")) if speculated else None}


def turn_fields(turn: EngineTurn, backend: Backend) -> dict[str, Any]:
    """The fields of a measured record (:mod:`harness.measure.records`) for a turn a backend ran: what the harness
    measures of its own turns where the engine gives it (the time to the first token is ``prefill_time_s``), None
    for what it cannot measure in another process (memory, energy, logits), and the engine's name, version and
    counters (``engine``, ``engine_version``, ``engine_options``, ``engine_counters``; ``engine_acceptance``: what
    those counters count, :func:`acceptance_source`, None without speculation), where it ran (``engine_url``,
    for a server) and how it was configured (``engine_config``), with the turn's ``token_times_s`` and
    ``engine_notes``."""
    n = turn.emitted()
    if n is None:
        raise BackendError(f"engine {backend.name} returned neither token ids nor a token count")
    # a server launched elsewhere may speculate although the entry did not say so: its counters tell
    speculated = backend.speculative or bool(turn.accepted_steps)
    lengths = accept_lengths(turn.accepted_steps, n, speculated, turn.forwards)
    if lengths is None:
        raise BackendError(f"engine {backend.name} speculated but reported no per-step acceptance; the turn's "
                           "forwards cannot be counted")
    notes = list(turn.notes)
    if turn.forwards is not None and len(lengths) != turn.forwards:
        notes.append(f"the engine's {turn.forwards} forwards do not fit its steps: forwards derived from the steps "
                     f"({len(lengths)})")
    return {
        "new_tokens": n, "steps": len(lengths), "accept_lengths": lengths,
        "accepted_drafts": list(turn.accepted_steps or []), "draft_depths": list(turn.drafted_steps or []),
        "wall_time_s": turn.wall_time_s, "prefill_time_s": turn.ttft_s,
        "stop_reason": STOP_REASONS.get(turn.stop_reason or "", turn.stop_reason),
        "output_ids": None if turn.token_ids is None else list(turn.token_ids),
        "rss_bytes": None, "peak_rss_bytes": None, "cuda_peak_allocated_bytes": None,
        "cuda_peak_reserved_bytes": None, "nvml_used_bytes": None, "energy_j": None, "mean_power_w": None,
        "timings": {}, "counters": {}, "timings_synchronised": None, "nvml_devices": None, "logit_margins": None,
        "logit_tops": None, "logit_runner_ups": None,
        **engine_fields(backend, speculated), "engine_options": dict(backend.engine_options),
        "engine_counters": turn.counters(), "token_times_s": turn.token_times_s, "engine_notes": notes,
    }
