"""The model's own forward: the slow reference the fast forward is compared with."""
from __future__ import annotations

import torch


def reference_forward(model, ids: list[int]) -> torch.Tensor:
    """The model's own causal forward over ``ids`` (all rows' logits): the slow reference for tests."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0]
