"""Which models ``lookupdec.fast_forward.FastForward`` runs: the architectures, dtypes and rope
types whose forward it computes; every other model keeps transformers' forward."""
from __future__ import annotations

import torch

from lookupdec.kvcache import all_full_attention
from lookupdec.release import held_parameter

# model_type values whose decoder layer is: RMSNorm, attention (q/k/v/o
# projections, rotary, GQA), residual, RMSNorm, SiLU-gated MLP, residual.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
# Rope types whose inverse frequencies do not depend on the sequence length,
# so one cos/sin table serves every position.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def fast_forward_unsupported_reason(model) -> str:
    """Why ``model`` cannot use ``FastForward`` ("" when it can).

    Example:
        >>> fast_forward_unsupported_reason(tiny_llama)     # doctest: +SKIP
        ''
    """
    cfg = model.config
    if getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return f"model_type {getattr(cfg, 'model_type', None)!r} is not one of {SUPPORTED_MODEL_TYPES}"
    param = held_parameter(model)
    if param.device.type != "cpu" or param.dtype != torch.float32:
        return f"needs a float32 CPU model, got {param.dtype} on {param.device}"
    if not torch.backends.mkldnn.is_available():
        return "torch is built without oneDNN"
    if not all_full_attention(cfg):
        return "sliding-window or non-full attention layers"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} is not silu"
    inner = getattr(model, "model", None)
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", None) not in SUPPORTED_ROPE_TYPES:
        return f"rope type {getattr(rotary, 'rope_type', None)!r} is not one of {SUPPORTED_ROPE_TYPES}"
    layer = inner.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if not hasattr(attn, name):
            return f"attention has no {name}"
    for name in ("gate_proj", "up_proj", "down_proj"):
        if not hasattr(mlp, name):
            return f"MLP has no {name}"
    if any(hasattr(attn, n) for n in ("q_norm", "k_norm")):
        return "q/k norms are not supported"
    return ""


def supports_fast_forward(model) -> bool:
    """True when ``FastForward(model)`` computes the model's forward (see the module docstring)."""
    return fast_forward_unsupported_reason(model) == ""
