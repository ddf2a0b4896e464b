"""What a served engine answers, checked before it is used: a field of the expected type, a count in range, the
per-request acceptance counters (vLLM's, SGLang's and llama.cpp's shapes) and their totals, SGLang's per-step
details; a malformed answer raises :class:`harness.backends.contract.BackendError` naming the server and the
field."""

from __future__ import annotations

import json
from typing import Any

from harness.backends.contract import (
    BackendError,
)
from harness.backends.prometheus import (
    MAX_DRAFT_POSITIONS,
)


def checked_field(value: Any, kind: type, field: str, what: str) -> Any:
    """``value`` where it is a ``kind``, else a BackendError naming the server (``what``) and the field."""
    if not isinstance(value, kind) or isinstance(value, bool):
        wanted = {list: "a list", dict: "an object", str: "text"}.get(kind, kind.__name__)
        sent = json.dumps(value) if _jsonable(value) else repr(value)
        raise BackendError(f"{what} sent {field} {sent[:60]}, not {wanted}")
    return value


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def checked_count(value: Any, field: str, what: str, most: int | None = None) -> int:
    """``value`` where it is a count (an integer >= 0, not a float or a boolean) of at most ``most``, else a
    BackendError naming the server (``what``) and the field."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BackendError(f"{what} sent {field} {str(value)[:40]}, not a count (an integer >= 0)")
    if most is not None and value > most:
        raise BackendError(f"{what} sent {field} {value}, more than {most} (the turn's tokens or the deepest draft "
                           "position): not this turn's count")
    return value


def checked_per_request(per_request: dict[str, Any], tokens: int, what: str) -> dict[str, Any]:
    """A turn's per-request metrics (:meth:`ServedBackend.stream`), every count checked: whole numbers >= 0 (not
    floats, booleans or NaN), no more steps or verification forwards than the turn's ``tokens`` (each yields at
    least one), no step deeper than :data:`MAX_DRAFT_POSITIONS`, no more accepted than drafted tokens. A count
    that is not one is a BackendError naming the server (``what``) and the field; a list or histogram is never
    expanded from a server's number before it is checked."""
    spec = "metrics.speculative_decoding"
    for key in ("per_step_accepted", "per_step_drafted"):
        if per_request.get(key) is not None:
            steps = checked_field(per_request[key], list, f"{spec}.{key}", what)
            checked_count(len(steps), f"{spec}.{key}'s length", what, tokens)
            for v in steps:
                checked_count(v, f"{spec}.{key}[]", what, MAX_DRAFT_POSITIONS)
    timings = per_request.get("timings")
    if isinstance(timings, dict) and (timings.get("draft_n") is not None or timings.get("draft_n_accepted")
                                      is not None):
        drafted = checked_count(timings.get("draft_n"), "timings.draft_n", what)
        checked_count(timings.get("draft_n_accepted"), "timings.draft_n_accepted", what, drafted)
    details = per_request.get("sglang")
    if details is not None:
        where = "sglext.spec_tokens_details"
        for key in ("spec_verify_ct", "spec_num_proposed_drafts", "spec_num_correct_drafts"):
            if details.get(key) is not None:
                checked_count(details[key], f"{where}.{key}", what, tokens if key == "spec_verify_ct" else None)
        if details.get("spec_correct_drafts_histogram") is not None:
            hist = checked_field(details["spec_correct_drafts_histogram"], list,
                                 f"{where}.spec_correct_drafts_histogram", what)
            checked_count(len(hist), f"{where}.spec_correct_drafts_histogram's length", what, MAX_DRAFT_POSITIONS + 1)
            checked_count(sum(checked_count(h, f"{where}.spec_correct_drafts_histogram[]", what) for h in hist),
                   f"{where}.spec_correct_drafts_histogram's sum", what, tokens)
    return per_request


def request_totals(per_request: dict[str, Any]) -> tuple[int, int] | None:
    """(drafted, accepted) tokens of one request from llama.cpp's per-request ``timings`` (``draft_n``,
    ``draft_n_accepted``, which llama-server sends on the last chunk of a request that drafted); None where either
    is missing (n/a, never 0). Example: {"timings": {"predicted_n": 16, "draft_n": 12, "draft_n_accepted": 9}} ->
    (12, 9); {"timings": {"predicted_n": 16}} -> None."""
    timings = per_request.get("timings")
    drafted, accepted = (timings.get("draft_n"), timings.get("draft_n_accepted")) if isinstance(timings, dict) else (
        None, None)
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (drafted, accepted)):
        return drafted, accepted
    return None


def sglang_steps(details: dict[str, Any]) -> dict[str, Any] | None:
    """A turn's acceptance from SGLang's per-request ``spec_tokens_details`` (its ``sglext`` with
    ``return_spec_tokens_details``): ``spec_verify_ct`` verification forwards, ``spec_num_proposed_drafts`` drafted
    tokens (verify_ct x (num_draft_tokens - 1), SGLang's own count), ``spec_num_correct_drafts`` accepted ones (the
    bonus token not counted) and ``spec_correct_drafts_histogram`` (h[j]: forwards that accepted exactly j drafts),
    from which the per-step accepted counts follow, listed from most to fewest accepted (SGLang does not send
    their order). None where the four disagree (n/a, never a guess), checked before any list is built from them
    (a histogram whose forwards are not ``spec_verify_ct`` is None; the served client has checked both against
    the turn's tokens, :func:`checked_per_request`, so no list is longer than the turn).

    Example: {"spec_verify_ct": 3, "spec_num_proposed_drafts": 9, "spec_num_correct_drafts": 4,
    "spec_correct_drafts_histogram": [1, 0, 2]} -> {"drafts": 3, "draft_tokens": 9, "accepted_tokens": 4,
    "accepted_per_pos": [2, 2, 0], "accepted_steps": [2, 2, 0], "drafted_steps": [3, 3, 3]}.
    """
    verify, proposed, correct, hist = (details.get(k) for k in (
        "spec_verify_ct", "spec_num_proposed_drafts", "spec_num_correct_drafts", "spec_correct_drafts_histogram"))
    if not (isinstance(verify, int) and isinstance(proposed, int) and isinstance(correct, int)
            and isinstance(hist, list) and verify > 0 and proposed % verify == 0):
        return None
    if not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hist) or sum(hist) != verify:
        return None  # checked before the steps are listed: no list as long as a server's number
    steps = [j for j in range(len(hist) - 1, -1, -1) for _ in range(hist[j])]
    if len(steps) != verify or sum(steps) != correct or any(j > proposed // verify for j in steps):
        return None
    k = proposed // verify
    return {"drafts": verify, "draft_tokens": proposed, "accepted_tokens": correct,
            "accepted_per_pos": [sum(j > i for j in steps) for i in range(k)], "accepted_steps": steps,
            "drafted_steps": [k] * verify}
