"""The training view of a feature dataset (:mod:`harness.train.features`): EAGLE's shifted pairs, input noise, a
torch ``Dataset`` over the shards with a held-out split, and the batch collation every objective reads.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from harness.train.features import read_manifest


def eagle_noise(shape: tuple[int, ...], seq_len: int, scale: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Uniform input noise: published ``U(-0.5, 0.5) * 0.2 * 512 / seq_len`` when ``scale`` is None, else
    ``U(-0.5, 0.5) * scale`` (a fixed scale that does not grow for short sequences).

    Example: seq_len=1024 -> amplitude 0.1, so values in [-0.05, 0.05]; seq_len=64 -> values in [-0.8, 0.8].
    """
    amp = 0.2 * 512 / seq_len if scale is None else scale
    return (torch.rand(shape, generator=generator) - 0.5) * amp


def shift_for_eagle(input_ids: torch.Tensor, hidden: torch.Tensor, loss_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """EAGLE's training pairs (arXiv:2401.15077 Sec. 3.2): position t reads (f_t, x_{t+1}) and regresses f_{t+1}.

    input_ids [S], hidden [S, H], loss_mask [S] -> features = hidden (noise is added by the caller),
    input_ids = ids[1:] + [0], target = hidden[1:] + a zero row, loss_mask with its last entry 0; the unshifted
    token_ids and token_mask (the stored mask) are kept for objectives that predict tokens (Medusa).
    Example: ids [5, 6, 7], mask [0, 1, 1] -> input_ids [6, 7, 0], loss_mask [0, 1, 0], target rows [h1, h2, 0].
    """
    zero = torch.zeros_like(hidden[:1])  # [1, H]
    mask = loss_mask.clone()
    mask[-1] = 0
    return {"features": hidden, "input_ids": torch.cat([input_ids[1:], input_ids.new_zeros(1)]),
            "target": torch.cat([hidden[1:], zero]), "loss_mask": mask, "token_ids": input_ids,
            "token_mask": loss_mask}


class FeatureDataset(torch.utils.data.Dataset):
    """The conversations of a built dataset as EAGLE training pairs (:func:`shift_for_eagle`), fp32.

    split: None (all), "train" or "eval"; the eval split is the last ``max(1, round(eval_fraction * n))``
    conversations in build order (EAGLE holds out the last 5% of its file list; ShareGPT is already shuffled).
    train_limit: with split "train", only the first that many training conversations (a prefix; the eval split is
    the same whatever the limit: the data-scaling curve, :mod:`harness.train.scaling`).
    noise: "eagle" (published ``U(-0.5,0.5)*0.2*512/S``), "none", or a float = fixed scale ``U(-0.5,0.5)*scale``.
    Items: features [S, H] (noised), input_ids [S], target [S, H], loss_mask [S] (float), token_ids [S] and
    token_mask [S] (unshifted); for a dataset built with ``layers`` also levels [S, k*H] (aligned with features,
    noised the same way; :attr:`hidden_layers` lists the hidden-state indices); after :meth:`attach_greedy` also
    greedy [S] (long).
    """

    def __init__(self, data_dir: str | Path, split: str | None = None, eval_fraction: float = 0.05,
                 noise: str | float = "eagle", max_len: int | None = None, max_shards: int | None = None,
                 train_limit: int | None = None):
        from safetensors import safe_open

        if split not in (None, "train", "eval"):
            raise ValueError(f"split must be None, 'train' or 'eval', got {split!r}")
        if not (isinstance(noise, (int, float)) or noise in ("eagle", "none")):
            raise ValueError(f"noise must be 'eagle', 'none' or a number (fixed scale), got {noise!r}")
        self.data_dir = Path(data_dir)
        self.manifest = read_manifest(self.data_dir, max_shards)
        self.noise, self.max_len = noise, max_len
        self.hidden_layers: list[int] | None = self.manifest.get("hidden_layers")
        index: list[tuple[str, int, int]] = []
        for s in self.manifest["shards"]:
            with safe_open(str(self.data_dir / s["file"]), framework="pt") as f:
                off = f.get_tensor("offsets").tolist()
            index += [(s["file"], off[i], off[i + 1]) for i in range(len(off) - 1)]
        n_eval = max(1, round(eval_fraction * len(index))) if len(index) > 1 and eval_fraction > 0 else 0
        self.index = {None: index, "train": index[: len(index) - n_eval], "eval": index[len(index) - n_eval:]}[split]
        if train_limit is not None:
            if split != "train" or not 1 <= train_limit <= len(self.index):
                raise ValueError(f"{data_dir}: train_limit={train_limit} needs split 'train' and 1..{len(self.index)} "
                                 f"(the training conversations), got split {split!r}")
            self.index = self.index[:train_limit]
        self._lm_head: torch.nn.Module | None = None
        self._greedy: dict[int, torch.Tensor] = {}

    def attach_greedy(self, lm_head: torch.nn.Module) -> None:
        """Give every item ``greedy`` [S] (long): the target's greedy token at each position, ``argmax
        lm_head(target)`` (the token greedy verification accepts; id 0 on the zero row after the last token), computed
        on ``lm_head``'s device the first time an item is read and kept (8 bytes a position) for every later read.

        Why: an objective that needs the target's full-vocabulary argmax (EAGLE-3's in-vocabulary mask, every
        accuracy) otherwise runs the V-wide ``lm_head`` over the batch at every step and every evaluation: on the
        default model about 30% of an EAGLE-3 step (tests/test_bench_train.py). The target features are stored and
        never noised, so the tokens do not change between epochs. Only for a dataset read in this process (a
        DataLoader with ``num_workers`` 0): a worker's copy would keep its own cache.
        """
        self._lm_head = lm_head

    def greedy(self, i: int, target: torch.Tensor) -> torch.Tensor:
        """Item ``i``'s greedy tokens [S] (long, CPU) from its target features ``target`` [S, H] (see
        :meth:`attach_greedy`)."""
        if i not in self._greedy:
            weight = self._lm_head.weight
            with torch.no_grad():
                self._greedy[i] = self._lm_head(target.to(weight.device, weight.dtype)).argmax(-1).cpu()
        return self._greedy[i]

    def __len__(self) -> int:
        return len(self.index)

    def index_sha256(self) -> str:
        """sha256 of this split's conversations as ``[[shard file, first row, end row], ...]`` JSON: equal for
        equal splits of the same shards (cut at ``max_len`` or not)."""
        return hashlib.sha256(json.dumps(self.index).encode()).hexdigest()

    def raw(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stored (input_ids [S] long, hidden [S, H] fp32, loss_mask [S] fp32) of item ``i``, cut at ``max_len``."""
        from safetensors import safe_open

        file, a, b = self.index[i]
        if self.max_len is not None:
            b = min(b, a + self.max_len)
        with safe_open(str(self.data_dir / file), framework="pt") as f:
            ids = f.get_slice("input_ids")[a:b].long()
            mask = f.get_slice("loss_mask")[a:b].float()
            hidden = f.get_slice("hidden")[a:b].float()
        return ids, hidden, mask

    def levels(self, i: int) -> torch.Tensor:
        """Stored levels [S, k*H] fp32 of item ``i`` (a dataset built with ``layers``), cut at ``max_len``."""
        from safetensors import safe_open

        file, a, b = self.index[i]
        if self.max_len is not None:
            b = min(b, a + self.max_len)
        with safe_open(str(self.data_dir / file), framework="pt") as f:
            return f.get_slice("levels")[a:b].float()

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        """Token frequencies at loss positions over this split's conversations (cut at ``max_len``), int64
        ``[vocab_size]`` (:func:`harness.engine.draftvocab.token_counts` summed)."""
        from safetensors import safe_open

        from harness.engine.draftvocab import token_counts

        total = torch.zeros(vocab_size, dtype=torch.int64)
        for file, a, b in self.index:
            b = b if self.max_len is None else min(b, a + self.max_len)
            with safe_open(str(self.data_dir / file), framework="pt") as f:
                total += token_counts(f.get_slice("input_ids")[a:b], f.get_slice("loss_mask")[a:b], vocab_size)
        return total

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids, hidden, mask = self.raw(i)
        item = shift_for_eagle(ids, hidden, mask)
        if self.hidden_layers:
            item["levels"] = self.levels(i)
        if self._lm_head is not None:
            item["greedy"] = self.greedy(i, item["target"])
        if self.noise != "none":
            scale = None if self.noise == "eagle" else float(self.noise)
            for key in ("features", "levels") if self.hidden_layers else ("features",):
                x = hidden if key == "features" else item[key]
                item[key] = x + eagle_noise(tuple(x.shape), x.shape[0], scale)
        return item


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad a list of :class:`FeatureDataset` items to the longest; padding has loss_mask 0 and id 0.

    Adds ``attention_mask`` [B, S] (1 on real positions). Right padding keeps causal attention exact for the real
    positions, which never look ahead.
    """
    S = max(it["input_ids"].shape[0] for it in items)
    out: dict[str, torch.Tensor] = {}
    for key in items[0]:
        rows = []
        for it in items:
            x = it[key]
            pad = [0, 0] * (x.dim() - 1) + [0, S - x.shape[0]]
            rows.append(torch.nn.functional.pad(x, pad))
        out[key] = torch.stack(rows)
    out["attention_mask"] = torch.stack([(torch.arange(S) < it["input_ids"].shape[0]).long() for it in items])
    return out

