"""Feature datasets for draft heads: conversations (:mod:`harness.train.sources`) -> chat-rendered tokens,
assistant loss mask and the target's features, in resumable shards.

Pipeline (the EAGLE/Jakiro data recipe, arXiv:2401.15077 Sec. 4 and the released ``eagle/ge_data/``
scripts, with the fixes noted below):

3. **Rendering.** The target's own chat template; ``loss_mask`` = 1 exactly on assistant tokens. The spans are
   derived by rendering prefixes (see :func:`assistant_char_spans`), not with EAGLE's hard-coded offsets.
   Truncated at ``max_len``. ``self_distill=True`` replaces every assistant turn by the target's greedy answer to
   the conversation so far (turn by turn, :mod:`harness.train.distill`), which matches the draft to the target's
   own distribution; that stage (a) stores the rendered ids and mask in a small token store
   (:class:`TokenStore`), kept and reused by any later build of the same conversations.
4. **Features.** Batched target forwards over the rendered ids (:func:`batched_features`: several conversations,
   right-padded, per forward); stored: ``input_ids``, ``loss_mask`` and the target's last
   hidden state AFTER the final norm (the ``lm_head`` input, ``base_model(...).last_hidden_state``; the test
   checks that it equals ``output_hidden_states[-1]`` and that ``lm_head`` of it gives the logits) as fp16.
   ``layers`` (off by default) also stores other hidden-state levels from the same forward, concatenated in the
   given order (``levels``): EAGLE-3 heads read the inputs of layers 2, L/2 and L-3 (``layers="low,mid,high"``,
   :func:`harness.engine.speculative.resolve_hidden_layers`; arXiv:2503.01840 Sec. 3). The manifest records the
   resolved indices (``hidden_layers``); datasets built without them read as before.

On-disk layout (``out_dir``)::

    manifest.json                     settings, counts, hashes, per-shard sha256 (rewritten after every shard),
                                      ``stages``: tokens, seconds and tokens/s of generation and of the features
    shard-00000.safetensors           conversations [0, shard_size) of the selection, concatenated:
        input_ids  int32  [T]         T = total tokens of the shard
        loss_mask  uint8  [T]
        hidden     fp16   [T, H]
        levels     fp16   [T, k*H]    only with ``layers`` (k levels, in the manifest's ``hidden_layers`` order)
        offsets    int64  [n + 1]     conversation i is rows offsets[i]:offsets[i+1]
        (metadata "ids": JSON list of conversation ids)
    distilled/                        with ``self_distill``: the token store of stage (a) (:class:`TokenStore`)

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
import time
from pathlib import Path
from typing import Any

import torch

from harness.engine.speculative import resolve_hidden_layers
from harness.models import Target
from harness.train.distill import make_generator, self_distilled
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


def batched_features(target: Target, seqs: list[list[int]], layers: tuple[int, ...] | None = None,
                     batch_tokens: int = 8192) -> list[tuple[torch.Tensor, ...]]:
    """The target's features of each token sequence, from batched forwards: ``seqs`` (n lists of ids) -> per
    sequence ``(hidden fp16 [S, H],)`` or, with ``layers`` (indices of ``output_hidden_states``),
    ``(hidden, levels fp16 [S, len(layers) * H])``, on CPU.

    ``hidden`` is the last hidden state after the final norm (the ``lm_head`` input). Sequences are sorted by length
    and grouped so that a group's rows times its longest length stay within ``batch_tokens`` (one sequence per
    forward at 0); a group is right-padded and run without an attention mask: under the causal mask a real token
    attends only to positions at or before it, all real, and the default position ids 0..S-1 are its own, so a
    row's features are those of a forward over the sequence alone up to floating-point rounding (the GEMMs of
    another batch shape sum in another order). Short conversations gain most: one forward's fixed cost is shared.
    """
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: list[tuple[torch.Tensor, ...]] = [()] * len(seqs)
    pad = target.tokenizer.pad_token_id if target.tokenizer is not None else None
    pad = 0 if pad is None else pad
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end + 1 - start) * len(seqs[order[end]]) <= batch_tokens:
            end += 1
        group = order[start:end]
        width = len(seqs[group[-1]])
        ids = torch.full((len(group), width), pad, dtype=torch.long)  # [B, S] right-padded
        for row, i in enumerate(group):
            ids[row, :len(seqs[i])] = torch.tensor(seqs[i])
        with torch.inference_mode():
            res = target.model.base_model(input_ids=ids.to(target.device), use_cache=False,
                                          output_hidden_states=list(layers) if layers else False)
        hidden = res.last_hidden_state.to("cpu", torch.float16)  # [B, S, H]
        levels = torch.cat([res.hidden_states[j].to("cpu") for j in layers], dim=-1).to(torch.float16) \
            if layers else None  # [B, S, k*H]
        for row, i in enumerate(group):
            n = len(seqs[i])
            out[i] = tuple(t[row, :n].clone() for t in (hidden, levels) if t is not None)
        start = end
    return out


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


def _resume_state(out_dir: Path, settings: dict, key: str = "shards") -> list[dict]:
    """The shards (``key``: or parts) a previous build with the same ``settings`` completed (empty for a fresh
    directory)."""
    path = out_dir / MANIFEST
    if not path.exists():
        return []
    old = json.loads(path.read_text(encoding="utf-8"))
    diff = sorted(k for k in settings if old.get("settings", {}).get(k) != settings[k])
    if diff:
        shown = ", ".join(f"{k}: {old.get('settings', {}).get(k)!r} -> {settings[k]!r}" for k in diff)
        raise ValueError(f"{out_dir} holds a build with different settings ({shown}); use a new output directory")
    shards = old.get(key, [])
    for s in shards:
        if not (out_dir / s["file"]).exists():
            raise FileNotFoundError(
                f"{out_dir / s['file']} is listed in {path} but missing; rebuild in a new directory")
    return shards


def part_name(k: int) -> str:
    return f"part-{k:05d}.jsonl"


def token_record(conv_id: str, ids: list[int], mask: list[int]) -> dict[str, Any]:
    """A conversation of the token store: its rendered ids and the loss mask as ``[start, end)`` runs of ones.
    Example: ids [1, 2, 3, 4, 5], mask [0, 1, 1, 0, 1] -> assistant [[1, 3], [4, 5]]."""
    runs: list[list[int]] = []
    for j, m in enumerate(mask):
        if m and runs and runs[-1][1] == j:
            runs[-1][1] = j + 1
        elif m:
            runs.append([j, j + 1])
    return {"id": conv_id, "input_ids": ids, "assistant": runs}


def record_mask(record: dict[str, Any]) -> list[int]:
    """The 0/1 loss mask of a token-store record (inverse of :func:`token_record`'s runs)."""
    mask = [0] * len(record["input_ids"])
    for a, b in record["assistant"]:
        mask[a:b] = [1] * (b - a)
    return mask


class TokenStore:
    """Stage (a) of a self-distilled build: the target's greedy answers (:mod:`harness.train.distill`) to every
    conversation of ``selection``, rendered to token ids with the assistant loss mask, in ``folder``::

        manifest.json        settings (what the ids depend on), per part: generator, tokens, seconds, tokens/s
        part-00000.jsonl     selection items [0, part_size), one JSON line each (in order, also when nothing is
                             left to learn from): {"id", "input_ids": [...], "assistant": [[start, end), ...]}

    :meth:`records` generates the parts a range needs that are not written yet, so features can follow generation
    shard by shard (and training can start on the first shards of a long build). Resumable like the shards (a part
    is written whole, then listed; a resume with other ``settings`` is refused) and reusable: a build with the same
    settings finds its parts present and generates nothing, whatever its feature settings. ``generator`` and
    ``batch`` change only speed (and near-ties; both recorded per part). The generator is started at the first
    part to write; :meth:`close` stops it."""

    def __init__(self, target: Target, selection: list[Conversation], folder: str | Path, settings: dict,
                 generator: str = "hf", batch: int = 16, part_size: int = 128):
        self.target, self.selection, self.folder = target, selection, Path(folder)
        self.generator, self.batch, self.part_size = generator, batch, part_size
        self.settings = {**settings, "part_size": part_size}
        self.folder.mkdir(parents=True, exist_ok=True)
        self.parts = {p["selection_range"][0] // part_size: p
                      for p in _resume_state(self.folder, self.settings, key="parts")}  # part index -> entry
        self.n_parts = math.ceil(len(selection) / part_size)
        self.gen = None

    def records(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """Selection items ``[lo, hi)``, generating the parts they lie in first where missing (only those: a
        resumed feature build whose first shards predate the store does not regenerate them)."""
        for k in range(lo // self.part_size, math.ceil(hi / self.part_size)):
            if k not in self.parts:
                self._write_part(k)
        return read_token_records(self.folder, lo, hi)

    def _write_part(self, k: int) -> None:
        if self.gen is None:
            self.gen = make_generator(self.generator, self.target, self.batch, self.settings["max_len"])
        convs = self.selection[k * self.part_size:(k + 1) * self.part_size]
        start, tokens = time.perf_counter(), self.gen.tokens
        distilled = self_distilled(self.target, [c.messages for c in convs], self.settings["max_len"],
                                   self.settings["max_new_tokens"], generate=self.gen)
        lines = []
        for conv, messages in zip(convs, distilled, strict=True):
            ids, mask = render_with_mask(self.target.tokenizer, messages, self.settings["max_len"]) if messages \
                else ([], [])
            lines.append(json.dumps(token_record(conv.id, ids, mask), separators=(",", ":")) + "\n")
        path = self.folder / part_name(k)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(lines), encoding="utf-8")
        os.replace(tmp, path)
        seconds, generated = time.perf_counter() - start, self.gen.tokens - tokens
        self.parts[k] = {"file": path.name, "sha256": file_sha256(path), "conversations": len(convs),
                         "generated_tokens": generated, "seconds": round(seconds, 3),
                         "tokens_per_s": round(generated / max(seconds, 1e-9), 2),
                         "selection_range": [k * self.part_size, k * self.part_size + len(convs)],
                         "generator": self.gen.describe()}
        _write_json(self.folder / MANIFEST, self.manifest())

    def manifest(self) -> dict[str, Any]:
        """What ``manifest.json`` holds: settings, parts, ``complete`` and the totals (generated tokens, seconds of
        generation and rendering, tokens/s)."""
        parts = [self.parts[k] for k in sorted(self.parts)]
        tokens, seconds = sum(p["generated_tokens"] for p in parts), sum(p["seconds"] for p in parts)
        return {"settings": self.settings, "target": self.target.name, "parts": parts,
                "complete": len(self.parts) == self.n_parts, "generated_tokens": tokens, "seconds": round(seconds, 3),
                "tokens_per_s": round(tokens / seconds, 2) if seconds else None}

    def stage(self) -> dict[str, Any]:
        """The build manifest's ``stages.generate``: the folder, totals so far and the generators that wrote it."""
        m = self.manifest()
        generators: list[dict] = []
        for part in m["parts"]:
            if part["generator"] not in generators:
                generators.append(part["generator"])
        return {"dir": str(self.folder), "tokens": m["generated_tokens"], "seconds": m["seconds"],
                "tokens_per_s": m["tokens_per_s"], "generators": generators}

    def close(self) -> None:
        if self.gen is not None:
            self.gen.close()
            self.gen = None


def read_token_records(tokens_dir: str | Path, lo: int, hi: int) -> list[dict[str, Any]]:
    """Selection items ``[lo, hi)`` of a token store (:class:`TokenStore`) whose parts cover them, in order."""
    tokens_dir = Path(tokens_dir)
    manifest = json.loads((tokens_dir / MANIFEST).read_text(encoding="utf-8"))
    out: list[dict[str, Any]] = []
    for part in manifest["parts"]:
        a, b = part["selection_range"]
        if b <= lo or a >= hi:
            continue
        lines = (tokens_dir / part["file"]).read_text(encoding="utf-8").splitlines()
        out += [json.loads(line) for line in lines[max(lo, a) - a:min(hi, b) - a]]
    return out


def build_dataset(target: Target, sources: list[str] | str, out_dir: str | Path, max_len: int = 2048,
                  limit: int | None = None, self_distill: bool = False, max_new_tokens: int = 512,
                  shard_size: int = 256, drop_contaminated: bool = True,
                  eval_questions: dict[str, list[str]] | None = None, data_dir: str | Path | None = None,
                  command: str | None = None, progress: bool = True, distill_batch: int = 16,
                  layers: str | list | None = None, generator: str = "hf", tokens_dir: str | Path | None = None,
                  part_size: int = 128, batch_tokens: int = 8192) -> dict[str, Any]:
    """Build (or resume) a feature dataset in ``out_dir`` and return its manifest (see the module docstring).

    ``layers``: also store these hidden-state levels (:func:`harness.engine.speculative.resolve_hidden_layers`,
    e.g. ``"low,mid,high"`` for EAGLE-3); None (default) stores the post-norm feature only.
    ``limit``: at most this many conversations per source. ``eval_questions``: prompt -> evaluation ids for the
    contamination check (default :func:`evaluation_questions` of ``data_dir``).
    ``self_distill``: two stages per shard. (a) :class:`TokenStore` in ``tokens_dir`` (default ``out_dir/distilled``;
    another build, e.g. with other ``layers``, given the same ``tokens_dir`` reuses it and generates nothing) with
    ``generator`` (``hf`` | ``vllm``) over ``distill_batch`` prompts at once, ``part_size`` conversations per file;
    (b) the features of the stored ids. ``batch_tokens``: tokens per feature forward (:func:`batched_features`).
    ``generator``, ``distill_batch`` and ``batch_tokens`` are speed knobs, not settings a resume must match. The
    manifest's ``stages`` give each stage's tokens, seconds and tokens/s.
    """
    from tqdm import tqdm

    sources = [sources] if isinstance(sources, str) else list(sources)
    unknown = [s for s in sources if s not in SOURCES and not s.endswith(".json")]
    if not sources or unknown:
        raise ValueError(f"sources must be a non-empty list of {', '.join(SOURCES)}; got {sources!r}")
    if max_len < 2 or shard_size < 1 or (limit is not None and limit < 1) or max_new_tokens < 1 \
            or part_size < 1 or distill_batch < 1 or batch_tokens < 0:
        raise ValueError(f"need max_len >= 2, shard_size >= 1, limit >= 1, max_new_tokens >= 1, part_size >= 1, "
                         f"distill_batch >= 1, batch_tokens >= 0; got max_len={max_len}, shard_size={shard_size}, "
                         f"limit={limit}, max_new_tokens={max_new_tokens}, part_size={part_size}, "
                         f"distill_batch={distill_batch}, batch_tokens={batch_tokens}")
    if tokens_dir is not None and not self_distill:
        raise ValueError("a token store (--tokens) holds self-distilled answers; it needs --self-distill")
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
    common = {
        "format": FORMAT_VERSION, "sources": sources, "limit": limit, "max_len": max_len,
        "max_new_tokens": max_new_tokens if self_distill else None, "drop_contaminated": drop_contaminated,
        "target_config_sha256": config_sha256(target.config), **tokenizer_hashes(target.tokenizer),
        "selection_sha256": _sha256_bytes("\n".join(c.id for c in selection).encode()),
    }
    settings = {**common, "self_distill": self_distill, "shard_size": shard_size,
                "layers": list(levels) if levels else None}
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
    store = None
    if self_distill:
        store = TokenStore(target, selection, out_dir / "distilled" if tokens_dir is None else tokens_dir, common,
                           generator, distill_batch, part_size)
    n_shards = math.ceil(len(selection) / shard_size)
    bar = tqdm(total=len(selection), initial=min(len(shards) * shard_size, len(selection)), unit="conv",
               desc="self-distill + features" if self_distill else "features", disable=not progress)
    try:
        for k in range(len(shards), n_shards):
            lo, hi = k * shard_size, min((k + 1) * shard_size, len(selection))
            if store is not None:
                rendered = [(r["id"], r["input_ids"], record_mask(r)) for r in store.records(lo, hi)]
                manifest["stages"] = {"generate": store.stage()}
            else:
                rendered = [(c.id, *render_with_mask(target.tokenizer, c.messages, max_len)) for c in selection[lo:hi]]
            kept = [r for r in rendered if any(r[2])]  # a first prompt beyond max_len leaves nothing to learn from
            start = time.perf_counter()
            feats = batched_features(target, [r[1] for r in kept], levels, batch_tokens)
            seconds = time.perf_counter() - start
            items = [(*r, *f) for r, f in zip(kept, feats, strict=True)]
            path = out_dir / shard_name(k)
            write_shard(path, items, hidden_size, len(levels) if levels else 0)
            shards.append({"file": path.name, "sha256": file_sha256(path), "conversations": len(items),
                           "tokens": sum(len(i[1]) for i in items), "selection_range": [lo, hi],
                           "feature_seconds": round(seconds, 3)})
            manifest["shards"] = shards
            _write_json(out_dir / MANIFEST, _with_totals(manifest))
            bar.update(hi - lo)
    finally:
        bar.close()
        if store is not None:
            store.close()
    if store is not None:
        manifest["stages"] = {"generate": store.stage()}
    manifest["complete"] = True
    _write_json(out_dir / MANIFEST, _with_totals(manifest))
    return _with_totals(manifest)


def _with_totals(manifest: dict) -> dict:
    shards = manifest["shards"]
    done = sum(s["selection_range"][1] - s["selection_range"][0] for s in shards)
    count = sum(s["conversations"] for s in shards)
    out = {**manifest, "count": count, "tokens": sum(s["tokens"] for s in shards),
           "skipped_no_assistant_tokens": done - count}
    timed = [s for s in shards if "feature_seconds" in s]  # shards of builds before stage timing have none
    if timed:
        tokens, seconds = sum(s["tokens"] for s in timed), sum(s["feature_seconds"] for s in timed)
        features = {"tokens": tokens, "seconds": round(seconds, 3),
                    "tokens_per_s": round(tokens / seconds, 2) if seconds else None}
        out["stages"] = {**manifest.get("stages", {}), "features": features}
    return out


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

