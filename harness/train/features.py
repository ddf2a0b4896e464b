"""Feature datasets for draft heads: conversations (:mod:`harness.train.sources`) -> chat-rendered tokens,
assistant loss mask and the target's features, in resumable shards.

Pipeline (the EAGLE/Jakiro data recipe, arXiv:2401.15077 Sec. 4 and the released ``eagle/ge_data/``
scripts, with the fixes noted below):

3. **Rendering.** The target's own chat template; ``loss_mask`` = 1 exactly on assistant tokens. The spans are
   derived by rendering prefixes (see :func:`assistant_char_spans`), not with EAGLE's hard-coded offsets.
   Truncated at ``max_len``. ``self_distill=True`` replaces every assistant turn by the target's greedy answer to
   the conversation so far (turn by turn), which matches the draft to the target's own distribution.
4. **Features.** One target forward per conversation; stored: ``input_ids``, ``loss_mask`` and the target's last
   hidden state AFTER the final norm (the ``lm_head`` input, ``base_model(...).last_hidden_state``; the test
   checks that it equals ``output_hidden_states[-1]`` and that ``lm_head`` of it gives the logits) as fp16.
   ``layers`` (off by default) also stores other hidden-state levels from the same forward, concatenated in the
   given order (``levels``): EAGLE-3 heads read the inputs of layers 2, L/2 and L-3 (``layers="low,mid,high"``,
   :func:`harness.engine.speculative.resolve_hidden_layers`; arXiv:2503.01840 Sec. 3). The manifest records the
   resolved indices (``hidden_layers``); datasets built without them read as before.

On-disk layout (``out_dir``)::

    manifest.json                     settings, counts, hashes, per-shard sha256 (rewritten after every shard)
    shard-00000.safetensors           conversations [0, shard_size) of the selection, concatenated:
        input_ids  int32  [T]         T = total tokens of the shard
        loss_mask  uint8  [T]
        hidden     fp16   [T, H]
        levels     fp16   [T, k*H]    only with ``layers`` (k levels, in the manifest's ``hidden_layers`` order)
        offsets    int64  [n + 1]     conversation i is rows offsets[i]:offsets[i+1]
        (metadata "ids": JSON list of conversation ids)

Resuming: shard k always holds selection items ``[k*shard_size, (k+1)*shard_size)``; a shard is written to a
temporary file and renamed, then recorded in the manifest, so a killed build restarts at the first shard the
manifest does not list and rewrites it: no duplicates, no torn shard. A resume with different settings is refused.
"""


from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

from harness.engine.speculative import resolve_hidden_layers
from harness.models import Target
from harness.train.sources import (
    SOURCES,
    Conversation,
    evaluation_questions,
    load_source,
    select,
)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class TemplateError(ValueError):
    """The chat template does not render conversations prefix-consistently, so assistant spans cannot be found."""



def _render(tokenizer, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_char_spans(tokenizer, messages: list[dict[str, str]], text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the assistant turns in ``text`` (the rendering of ``messages``).

    Turn i starts where ``render(messages[:i], add_generation_prompt=True)`` ends and ends where
    ``render(messages[:i+1])`` ends, minus trailing whitespace: the reply and its end-of-turn marker (which the
    model generates), not the template's newline after it. Both renders must be prefixes of ``text``.
    Example (ChatML): "<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\nyo<|im_end|>\\n" -> [(52, 64)]
    = "yo<|im_end|>".
    """
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True)
        through = _render(tokenizer, messages[: i + 1], False)
        if not (text.startswith(before) and text.startswith(through)):
            raise TemplateError("the chat template renders a conversation differently from its prefixes (turn "
                                f"{i}); assistant spans cannot be derived for this template")
        end = len(through)
        while end > len(before) and text[end - 1].isspace():
            end -= 1
        spans.append((len(before), end))
    return spans


def render_with_mask(tokenizer, messages: list[dict[str, str]], max_len: int) -> tuple[list[int], list[int]]:
    """Token ids of the chat-rendered conversation and a 0/1 mask that is 1 on assistant tokens, cut at ``max_len``.

    A token is an assistant token when its first character lies in an assistant span (needs a fast tokenizer's
    offset mapping). Example with a one-character-per-token ChatML tokenizer: [user "hi", assistant "yo"] ->
    mask 1 exactly at the tokens "y", "o", "<|im_end|>" (positions 21, 22, 23 of 25).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise TemplateError(f"{type(tokenizer).__name__} is not a fast tokenizer: the loss mask needs offset mappings")
    text = _render(tokenizer, messages, False)
    spans = assistant_char_spans(tokenizer, messages, text)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"][:max_len], enc["offset_mapping"][:max_len]
    mask = [int(any(a <= start < b for a, b in spans)) for start, _ in offsets]
    return ids, mask


def self_distilled(target: Target, conversations: list[list[dict[str, str]]], max_len: int, max_new_tokens: int,
                   batch_size: int = 16) -> list[list[dict[str, str]]]:
    """Each conversation's ``messages`` with every assistant turn replaced by the target's greedy answer to the
    (regenerated) history.

    Turns whose prompt already reaches ``max_len`` tokens are dropped with everything after them (they would be
    truncated away anyway); each answer is capped so that prompt + answer fit in ``max_len``. Work is batched
    across conversations: round r regenerates the r-th assistant turn of every conversation still going, in
    batches of ``batch_size`` prompts of similar length (left-padded, :func:`greedy_batch`), so a shard costs about
    (its turns / batch_size) batched generations instead of one generation per turn. On a CPU a batch of 16 short
    prompts costs little more than one (weights are read once per step), which makes self-distillation affordable.
    """
    outs: list[list[dict[str, str]]] = [[] for _ in conversations]
    cursor = [0] * len(conversations)
    going = list(range(len(conversations)))
    while going:
        pending: list[tuple[int, list[int], int]] = []  # (conversation, prompt ids, room)
        for i in going:
            msgs = conversations[i]
            while cursor[i] < len(msgs) and msgs[cursor[i]]["role"] != "assistant":
                outs[i].append(dict(msgs[cursor[i]]))
                cursor[i] += 1
            if cursor[i] >= len(msgs):
                continue
            prompt = target.render_chat(outs[i])[0].tolist()
            room = min(max_new_tokens, max_len - len(prompt))
            if room <= 0:
                outs[i] = outs[i][:-1]  # drop the unanswered user turn and stop this conversation
                continue
            pending.append((i, prompt, room))
        pending.sort(key=lambda t: len(t[1]))
        for b in range(0, len(pending), batch_size):
            chunk = pending[b:b + batch_size]
            answers = greedy_batch(target, [p for _, p, _ in chunk], [r for _, _, r in chunk])
            for (i, _, _), answer in zip(chunk, answers):
                outs[i].append({"role": "assistant", "content": target.decode(answer)})
                cursor[i] += 1
        going = [i for i, _, _ in pending]
    return outs


def greedy_batch(target: Target, prompts: list[list[int]], rooms: list[int]) -> list[list[int]]:
    """Greedy continuations of several prompts at once: ``model.generate`` on left-padded ids with an attention
    mask (position ids follow the mask, so padding does not shift positions). Prompt i gets at most ``rooms[i]``
    new tokens and stops at its first EOS (excluded). Batched fp32 arithmetic may break a near-tie differently
    from a one-prompt run; for training data that is immaterial (the test checks agreement on a tiny model).
    """
    pad = target.tokenizer.pad_token_id
    pad = pad if pad is not None else (min(target.eos_ids) if target.eos_ids else 0)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)     # [B, P]
    mask = torch.zeros((len(prompts), width), dtype=torch.long)        # [B, P]
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    eos = sorted(target.eos_ids)
    with torch.inference_mode():
        out = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                    max_new_tokens=max(rooms), do_sample=False, num_beams=1, pad_token_id=pad,
                                    eos_token_id=eos or None, temperature=None, top_p=None, top_k=None)
    answers = []
    for row, room in enumerate(rooms):
        new = out[row, width:width + room].tolist()
        cut = next((j for j, t in enumerate(new) if t in target.eos_ids), len(new))
        answers.append(new[:cut])
    return answers


def target_features(target: Target, input_ids: list[int]) -> torch.Tensor:
    """The target's last hidden state after the final norm (the ``lm_head`` input): ids [S] -> fp16 [S, H] on CPU."""
    ids = torch.tensor([input_ids], dtype=torch.long, device=target.device)  # [1, S]
    with torch.inference_mode():
        h = target.model.base_model(input_ids=ids, use_cache=False).last_hidden_state  # [1, S, H]
    return h[0].to("cpu", torch.float16)


def target_feature_levels(target: Target, input_ids: list[int],
                          layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`target_features` and, from the same forward, the hidden states ``layers`` (indices of
    ``output_hidden_states``) concatenated: ids [S] -> (fp16 [S, H], fp16 [S, len(layers) * H]) on CPU."""
    ids = torch.tensor([input_ids], dtype=torch.long, device=target.device)  # [1, S]
    with torch.inference_mode():
        out = target.model.base_model(input_ids=ids, use_cache=False, output_hidden_states=list(layers))
    levels = torch.cat([out.hidden_states[i][0].to("cpu") for i in layers], dim=-1)  # [S, k*H]
    return out.last_hidden_state[0].to("cpu", torch.float16), levels.to(torch.float16)


# ---------------------------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------------------------


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def config_sha256(config) -> str:
    """Hash of a transformers config's fields (private fields, paths and the library version excluded)."""
    d = {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k != "transformers_version"}
    return _sha256_bytes(json.dumps(d, sort_keys=True, default=str).encode())


def tokenizer_hashes(tokenizer) -> dict[str, str | None]:
    template = getattr(tokenizer, "chat_template", None)
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    return {"chat_template_sha256": _sha256_bytes(template.encode()) if template else None,
            "vocab_sha256": _sha256_bytes(vocab.encode())}


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.safetensors"


def write_shard(path: Path, items: list[tuple], hidden_size: int, levels: int = 0) -> None:
    """Write ``(id, input_ids, loss_mask, hidden [S, H])`` items, or ``(..., levels [S, levels * H])`` ones when
    ``levels`` > 0, as one safetensors file, atomically (tmp + rename)."""
    from safetensors.torch import save_file

    lengths = [len(it[1]) for it in items]
    offsets = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)  # [n + 1]
    tensors = {
        "input_ids": torch.tensor([t for it in items for t in it[1]], dtype=torch.int32),
        "loss_mask": torch.tensor([t for it in items for t in it[2]], dtype=torch.uint8),
        "hidden": torch.cat([it[3] for it in items]) if items else torch.zeros(0, hidden_size, dtype=torch.float16),
        "offsets": offsets,
    }
    if levels:
        tensors["levels"] = torch.cat([it[4] for it in items]) if items else \
            torch.zeros(0, levels * hidden_size, dtype=torch.float16)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"ids": json.dumps([it[0] for it in items])})
    os.replace(tmp, path)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _resume_state(out_dir: Path, settings: dict) -> list[dict]:
    """The shards a previous build with the same ``settings`` completed (empty for a fresh directory)."""
    path = out_dir / MANIFEST
    if not path.exists():
        return []
    old = json.loads(path.read_text(encoding="utf-8"))
    diff = sorted(k for k in settings if old.get("settings", {}).get(k) != settings[k])
    if diff:
        shown = ", ".join(f"{k}: {old.get('settings', {}).get(k)!r} -> {settings[k]!r}" for k in diff)
        raise ValueError(f"{out_dir} holds a build with different settings ({shown}); use a new output directory")
    shards = old.get("shards", [])
    for s in shards:
        if not (out_dir / s["file"]).exists():
            raise FileNotFoundError(
                f"{out_dir / s['file']} is listed in {path} but missing; rebuild in a new directory")
    return shards


def build_dataset(target: Target, sources: list[str] | str, out_dir: str | Path, max_len: int = 2048,
                  limit: int | None = None, self_distill: bool = False, max_new_tokens: int = 512,
                  shard_size: int = 256, drop_contaminated: bool = True,
                  eval_questions: dict[str, list[str]] | None = None, data_dir: str | Path | None = None,
                  command: str | None = None, progress: bool = True, distill_batch: int = 16,
                  layers: str | list | None = None) -> dict[str, Any]:
    """Build (or resume) a feature dataset in ``out_dir`` and return its manifest (see the module docstring).

    ``layers``: also store these hidden-state levels (:func:`harness.engine.speculative.resolve_hidden_layers`,
    e.g. ``"low,mid,high"`` for EAGLE-3); None (default) stores the post-norm feature only.
    ``limit``: at most this many conversations per source. ``distill_batch``: prompts per batched generation with
    ``self_distill`` (a speed knob only; not part of the settings a resume must match). ``eval_questions``: prompt ->
    evaluation ids for the contamination check (default :func:`evaluation_questions` of ``data_dir``).
    """
    from tqdm import tqdm

    sources = [sources] if isinstance(sources, str) else list(sources)
    unknown = [s for s in sources if s not in SOURCES and not s.endswith(".json")]
    if not sources or unknown:
        raise ValueError(f"sources must be a non-empty list of {', '.join(SOURCES)}; got {sources!r}")
    if max_len < 2 or shard_size < 1 or (limit is not None and limit < 1) or max_new_tokens < 1:
        raise ValueError(f"need max_len >= 2, shard_size >= 1, limit >= 1, max_new_tokens >= 1; got max_len={max_len}, "
                         f"shard_size={shard_size}, limit={limit}, max_new_tokens={max_new_tokens}")
    out_dir = Path(out_dir)
    questions = evaluation_questions(data_dir) if eval_questions is None else eval_questions
    selection: list[Conversation] = []
    dropped: dict[str, list[str]] = {}
    for name in sources:
        kept, drop = select(load_source(name, data_dir), questions, limit, drop_contaminated)
        selection += kept
        dropped.update(drop)
    hidden_size = target.model.get_output_embeddings().weight.shape[1]
    levels = None
    if layers is not None:
        levels = resolve_hidden_layers(layers, target.model.config.get_text_config(decoder=True).num_hidden_layers)
    settings = {
        "format": FORMAT_VERSION, "sources": sources, "limit": limit, "max_len": max_len, "self_distill": self_distill,
        "max_new_tokens": max_new_tokens if self_distill else None, "shard_size": shard_size,
        "drop_contaminated": drop_contaminated, "target_config_sha256": config_sha256(target.config),
        **tokenizer_hashes(target.tokenizer),
        "selection_sha256": _sha256_bytes("\n".join(c.id for c in selection).encode()),
        "layers": list(levels) if levels else None,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = _resume_state(out_dir, settings)
    manifest = {
        "settings": settings, "target": target.name, "hidden_size": hidden_size, "hidden_dtype": "float16",
        "feature": "last hidden state after the final norm (lm_head input)",
        **({"hidden_layers": list(levels), "levels": "hidden states entering these layers, concatenated"}
           if levels else {}),
        "command": command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "contaminated_dropped": len(dropped), "contaminated_ids": dict(sorted(dropped.items())),
        "eval_prompts_checked": len(questions), "selected": len(selection), "shards": shards, "complete": False,
    }
    n_shards = math.ceil(len(selection) / shard_size)
    bar = tqdm(total=len(selection), initial=min(len(shards) * shard_size, len(selection)), unit="conv",
               desc="features", disable=not progress)
    for k in range(len(shards), n_shards):
        items = []
        convs = selection[k * shard_size:(k + 1) * shard_size]
        all_messages = [c.messages for c in convs]
        if self_distill:
            all_messages = self_distilled(target, all_messages, max_len, max_new_tokens, distill_batch)
        for conv, messages in zip(convs, all_messages):
            ids, mask = render_with_mask(target.tokenizer, messages, max_len) if messages else ([], [])
            if any(mask):  # a first prompt longer than max_len leaves nothing to learn from
                feats = target_feature_levels(target, ids, levels) if levels else (target_features(target, ids),)
                items.append((conv.id, ids, mask, *feats))
            bar.update(1)
        path = out_dir / shard_name(k)
        write_shard(path, items, hidden_size, len(levels) if levels else 0)
        shards.append({"file": path.name, "sha256": file_sha256(path), "conversations": len(items),
                       "tokens": sum(len(i[1]) for i in items),
                       "selection_range": [k * shard_size, min((k + 1) * shard_size, len(selection))]})
        manifest["shards"] = shards
        _write_json(out_dir / MANIFEST, _with_totals(manifest))
    bar.close()
    manifest["complete"] = True
    _write_json(out_dir / MANIFEST, _with_totals(manifest))
    return _with_totals(manifest)


def _with_totals(manifest: dict) -> dict:
    shards = manifest["shards"]
    done = sum(s["selection_range"][1] - s["selection_range"][0] for s in shards)
    count = sum(s["conversations"] for s in shards)
    return {**manifest, "count": count, "tokens": sum(s["tokens"] for s in shards),
            "skipped_no_assistant_tokens": done - count}


def read_manifest(data_dir: str | Path, max_shards: int | None = None) -> dict:
    """The dataset manifest. With ``max_shards`` only the first that many shards are used (they must be written),
    so training can start on a prefix while a long build goes on; otherwise the build must be complete."""
    path = Path(data_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: {data_dir} is not a feature dataset (build one with `draftbench data build`)")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if max_shards is not None:
        if max_shards < 1 or len(manifest["shards"]) < max_shards:
            raise ValueError(f"{path}: {len(manifest['shards'])} shards are written, {max_shards} requested")
        return {**manifest, "shards": manifest["shards"][:max_shards]}
    if not manifest.get("complete"):
        raise ValueError(f"{path}: the build is incomplete; rerun the same `data build` command to finish it "
                         "(or train on its written shards with --max-shards)")
    return manifest


def merge_datasets(sources: list[str | Path], out_dir: str | Path, command: str | None = None) -> dict[str, Any]:
    """One dataset from the written shards of several (e.g. reference answers + self-distilled ones).

    The sources must hold features of the same target (config, chat template, vocabulary and hidden size are
    compared); an interrupted build contributes the shards it finished. ``out_dir`` gets relative symbolic links
    ``shard-NNNNN.safetensors`` (sources in the order given) and a manifest listing each shard's origin; nothing is
    copied. The held-out split of training is the end of the last source.
    """
    out_dir = Path(out_dir)
    if len(sources) < 2:
        raise ValueError("data merge: give at least two source datasets")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} exists and is not empty; merge into a new folder")
    manifests = []
    for src in map(Path, sources):
        path = src / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: {src} is not a feature dataset")
        manifests.append((src, json.loads(path.read_text(encoding="utf-8"))))
    keys = ("target_config_sha256", "chat_template_sha256", "vocab_sha256", "layers")
    src0, m0 = manifests[0]
    for src, m in manifests[1:]:
        diff = [k for k in keys if m["settings"].get(k) != m0["settings"].get(k)]
        if m["hidden_size"] != m0["hidden_size"]:
            diff.append("hidden_size")
        if diff:
            raise ValueError(f"data merge: {src} and {src0} were built differently ({', '.join(diff)} differ); "
                             "merge only features of the same target")
    out_dir.mkdir(parents=True, exist_ok=True)
    shards, origins = [], []
    for src, m in manifests:
        for s in m["shards"]:
            name = shard_name(len(shards))
            os.symlink(os.path.relpath((src / s["file"]).resolve(), out_dir.resolve()), out_dir / name)
            shards.append({**s, "file": name, "source": str(src), "source_file": s["file"]})
        origins.append({"dir": str(src), "shards": len(m["shards"]), "complete": bool(m.get("complete")),
                        "settings": m["settings"], "command": m.get("command")})
    manifest = {
        "settings": {"format": FORMAT_VERSION, "merged": True, **{k: m0["settings"].get(k) for k in keys}},
        "target": m0["target"], "hidden_size": m0["hidden_size"], "hidden_dtype": m0["hidden_dtype"],
        "feature": m0["feature"], **{k: m0[k] for k in ("hidden_layers", "levels") if k in m0},
        "command": command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "sources": origins,
        "contaminated_dropped": sum(m.get("contaminated_dropped", 0) for _, m in manifests),
        "shards": shards, "complete": True,
    }
    _write_json(out_dir / MANIFEST, _with_totals(manifest))
    return _with_totals(manifest)


def dataset_token_counts(data_dir: str | Path, vocab_size: int, max_shards: int | None = None) -> torch.Tensor:
    """Token frequencies at loss positions over a feature dataset's shards, int64 ``[vocab_size]``
    (:func:`harness.engine.draftvocab.token_counts` summed; reads only ``input_ids`` and ``loss_mask``)."""
    from safetensors import safe_open

    from harness.engine.draftvocab import token_counts

    data_dir = Path(data_dir)
    total = torch.zeros(vocab_size, dtype=torch.int64)
    for s in read_manifest(data_dir, max_shards)["shards"]:
        with safe_open(str(data_dir / s["file"]), framework="pt") as f:
            total += token_counts(f.get_tensor("input_ids"), f.get_tensor("loss_mask"), vocab_size)
    return total


def verify_shards(data_dir: str | Path) -> None:
    """Raise if a shard's sha256 differs from the manifest's (a corrupted or replaced file)."""
    data_dir = Path(data_dir)
    for s in read_manifest(data_dir)["shards"]:
        got = file_sha256(data_dir / s["file"])
        if got != s["sha256"]:
            raise ValueError(f"{data_dir / s['file']}: sha256 {got} differs from the manifest's {s['sha256']}")

