"""Conversation templates for targets whose tokenizer has none (or a different one than a paper used).

Run field ``chat_template`` names a template shipped in ``harness/run/templates/<name>.jinja`` or a ``.jinja`` file;
it replaces the tokenizer's chat template for the whole run (:meth:`harness.models.Target.render_chat` renders
with it). Run field ``system_prompt`` replaces every suite's system prompt.

Shipped:

* ``vicuna_v1.1``: FastChat's "vicuna_v1.1" conversation (``get_conversation_template("vicuna")``), which the
  EAGLE/EAGLE-2 (arXiv:2401.15077, 2406.16858), Jakiro (arXiv:2502.06282) and Spec-Bench (arXiv:2401.07851)
  evaluations use for Vicuna-v1.3, whose tokenizer ships no chat template::

      <s>{system} USER: {q1} ASSISTANT: {a1}</s>USER: {q2} ASSISTANT:

  with FastChat's default system message unless a system message is given.
"""

from __future__ import annotations

from pathlib import Path

from harness.models import Target
from harness.run.shipped import find_shipped, shipped_names
from harness.schema import InputError

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"


class ChatTemplateError(InputError):
    """An unknown chat template name or an unreadable template file; the message names the field."""


def template_names() -> list[str]:
    """The shipped templates' names (``harness/run/templates/*.jinja``)."""
    return shipped_names(TEMPLATE_DIR, ".jinja")


def resolve_chat_template(name_or_path: str, field: str = "run.chat_template") -> str:
    """The Jinja text of a shipped template name or of a ``.jinja`` file; one clear error naming ``field`` if neither.

    Example: resolve_chat_template("vicuna_v1.1") -> "{{ bos_token }}{% if messages[0]['role'] == 'system' %}..."
    """
    path = find_shipped(name_or_path, TEMPLATE_DIR, (".jinja",))
    if path is not None:
        return path.read_text(encoding="utf-8")
    raise ChatTemplateError(f"{field}: unknown chat template {name_or_path!r}; shipped: "
                            f"{', '.join(template_names())} (or the path of a .jinja file)")


def apply_chat_template(target: Target, name_or_path: str | None) -> None:
    """Make ``target`` render prompts with the named template (nothing to do for None)."""
    if name_or_path is not None:
        target.tokenizer.chat_template = resolve_chat_template(name_or_path)
