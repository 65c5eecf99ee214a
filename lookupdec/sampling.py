"""The target distribution for sampling: temperature, top-k, top-p.

Applied in transformers' order (temperature, then top-k, then top-p), so a
speculative step samples from exactly the distribution a plain sampling step
would. Greedy decoding (temperature 0) never calls this module's samplers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lookupdec._native import sample_row_ptr

# Below this temperature the logits over the temperature can overflow float32 (a CPU's native
# draw takes float32), so the scaled logits are taken in float64 from the row's maximum: the
# same distribution, with no infinities (``target_probs``).
TINY_TEMPERATURE = 1e-20


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from the target's logits.

    Attributes:
        temperature: 0 means greedy (argmax); > 0 divides the logits.
        top_p: keep the smallest set of most likely tokens whose mass reaches
            ``top_p`` (1.0 keeps all).
        top_k: keep the ``top_k`` most likely tokens (0 keeps all).

    Example:
        >>> SamplingParams(temperature=0.7, top_p=0.9).greedy
        False
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = no limit), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities of the next token after temperature, top-k and top-p.

    Args:
        logits: ``(..., vocab)`` raw logits of the target model.
        params: sampling settings with ``temperature > 0``.
    Returns:
        float32 (or the logits' wider dtype) probabilities of the same shape;
        filtered tokens get exactly 0.
    Example:
        >>> p = target_probs(torch.tensor([2.0, 1.0, 0.0]), SamplingParams(1.0, top_k=2))
        >>> p[2].item()
        0.0
    """
    assert params.temperature > 0, "greedy decoding takes the argmax"
    if params.temperature < TINY_TEMPERATURE:
        wide = logits.double()
        scores = (wide - wide.max(dim=-1, keepdim=True).values) / params.temperature
    else:
        scores = logits.float() / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        # Mass strictly before each token: a token is kept while the tokens
        # ranked above it have not yet reached top_p (the first is always kept,
        # even where top_p rounds to 0 in the scores' precision).
        before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = before >= params.top_p
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id drawn from a 1-D probability vector (need not be normalised; none negative).

    By the inverse of the float64 cumulative distribution: one uniform draw and a binary search.
    ``torch.multinomial`` draws one exponential variate per token for a single sample (~0.9 ms
    over a 49,152-token vocabulary on a 2-core Xeon, 6-7% of a decoding step); this is ~0.05 ms.
    A token of probability 0 is never drawn.

    Example:
        >>> sample(torch.tensor([0.0, 0.0, 3.0, 0.0]), None)
        2
    """
    return sample_at(probs, float(torch.rand((), generator=generator, dtype=torch.float64)))


def sample_at(probs: torch.Tensor, u: float) -> int:
    """The token at ``u`` in [0, 1) of the float64 cumulative distribution of ``probs`` (1-D, none negative).

    With ``u`` uniform this is a draw from ``probs``; the same ``u`` and the same vector give
    the same token. A token of probability 0 is never returned.

    Example:
        >>> [sample_at(torch.tensor([0.25, 0.0, 0.75]), u) for u in (0.0, 0.2, 0.25, 0.99)]
        [0, 0, 2, 2]
    """
    c = torch.cumsum(probs.to(device="cpu", dtype=torch.float64), 0)  # on the CPU whatever the device: one sum order
    i = int(torch.searchsorted(c, u * c[-1], right=True))
    if i >= c.shape[0]:  # u rounded up to the total: the last token with mass
        i = int(torch.nonzero(probs > 0)[-1])
    return i


def draw(logits: torch.Tensor, params: SamplingParams, u: float) -> int:
    """``sample_at(target_probs(logits, params), u)``: the token at ``u`` of the target distribution.

    A CPU float32 row with neither top-k nor top-p takes one native call (``ext/csrc/sample.c``:
    the scaled logits' exp and their sum, then the cumulative walk; about twice as fast as the
    torch route, ``benchmarks/logit_rows.py``); every other case the torch route. Plain sampling and a verified tree's rows both draw
    through here, so every method with deterministic drafts still samples plain sampling's tokens.

    Example:
        >>> draw(torch.tensor([0.0, 5.0, float("-inf")]), SamplingParams(1.0), 0.5)
        1
    """
    if (logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 1
            and params.top_k == 0 and params.top_p >= 1.0 and params.temperature >= TINY_TEMPERATURE):
        x = logits.contiguous()
        scratch = torch.empty_like(x)  # named: a temporary would be freed before the call reads it
        return int(sample_row_ptr(x.data_ptr(), x.shape[0], params.temperature, u, scratch.data_ptr()))
    return sample_at(target_probs(logits, params), u)


_MASK64 = (1 << 64) - 1


def position_uniform(key: int, position: int) -> float:
    """A uniform number in [0, 1) for output position ``position`` of the generation keyed ``key``.

    splitmix64 of the key and the position: a counter-based generator, so the number for a
    position does not depend on how many were drawn before it. A sequence samples its token at
    position ``t`` as ``sample_at(p_t, position_uniform(key, t))`` whether it decodes one token a
    step or verifies a draft tree (``lookupdec.sequence``): with the same key every method whose
    drafts are deterministic emits the tokens plain sampling emits.

    Example:
        >>> position_uniform(7, 3) == position_uniform(7, 3) != position_uniform(7, 4)
        True
    """
    z = (int(key) * 0x9E3779B97F4A7C15 + (int(position) + 1) * 0xD1B54A32D192ED03) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return (z >> 11) * (1.0 / (1 << 53))


def request_generators(params: SamplingParams, seed: int | None) -> tuple[torch.Generator | None, torch.Generator | None]:
    """A sampled request's two generators: its acceptance draws' and its drafter's (None, None when greedy).

    The drafter's is seeded from the request's, so its draws stay independent of the
    acceptance draws and the same ``seed`` gives the same output; no ``seed``: a random one.

    Example:
        >>> g, d = request_generators(SamplingParams(0.7), 5)
        >>> g.initial_seed(), d.initial_seed() == request_generators(SamplingParams(0.7), 5)[1].initial_seed()
        (5, True)
        >>> request_generators(SamplingParams(0.0), 5)
        (None, None)
    """
    if params.greedy:
        return None, None
    generator = torch.Generator(device="cpu")
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    draft_gen = torch.Generator(device="cpu")
    draft_gen.manual_seed((generator.initial_seed() * 0x9E3779B97F4A7C15 + 1) % (1 << 63))
    return generator, draft_gen
