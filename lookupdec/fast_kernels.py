"""Prepacked oneDNN weights for ``nn.Linear`` layers on CPU (float32).

oneDNN reorders a weight into its blocked layout on every call of a plain
``F.linear``; packing each weight once (``Tensor.to_mkldnn``) removes that
cost and speeds up the small-width products of decoding by about a third on
this model. The packed layer computes the same product with the same library,
but its rounding may differ from ``F.linear``'s, so exactness is stated against
decoding with the same kernels (tests/test_decoder_exact.py).

``pack_linears`` swaps modules in place; ``unpack_linears`` restores plain
``nn.Linear`` layers with the same weights.
"""
from __future__ import annotations

import torch
from torch import nn

from lookupdec.release import held_parameter


def fast_kernels_available(model) -> bool:
    """True when prepacking applies: a float32 model on the CPU with oneDNN built in."""
    param = held_parameter(model)
    return param.device.type == "cpu" and param.dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    """``nn.Linear`` with its weight prepacked for oneDNN (inference only).

    Args:
        linear: the layer to pack; its weight is copied into the packed form.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        with torch.no_grad():
            self.packed_weight = linear.weight.detach().float().contiguous().to_mkldnn()
            self.packed_bias = None if linear.bias is None else linear.bias.detach().float().contiguous().to_mkldnn()
        # Kept dense for unpacking and for code that reads `.weight` (never used in forward).
        self._dense_bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous().to_mkldnn()
        if self.packed_bias is None:
            y = torch._C._nn.mkldnn_linear(x2, self.packed_weight, None)
        else:
            y = torch._C._nn.mkldnn_linear(x2, self.packed_weight, self.packed_bias)
        return y.to_dense().reshape(*shape[:-1], self.out_features)

    def to_linear(self) -> nn.Linear:
        out = nn.Linear(self.in_features, self.out_features, bias=self._dense_bias is not None)
        with torch.no_grad():
            out.weight.copy_(self.packed_weight.to_dense())
            if self._dense_bias is not None:
                out.bias.copy_(self._dense_bias)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def pack_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a ``PackedLinear``; return how many.

    Raises:
        ValueError: the model is not a float32 CPU model (see ``fast_kernels_available``).
    Example:
        >>> pack_linears(model)            # doctest: +SKIP
        211
    """
    if not fast_kernels_available(model):
        raise ValueError("fast kernels need a float32 model on the CPU; pass hf_kernels=True")
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count


def unpack_linears(model: nn.Module) -> int:
    """Undo ``pack_linears`` (plain ``nn.Linear`` layers with the same weights); return how many."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                setattr(parent, name, child.to_linear())
                count += 1
    return count
