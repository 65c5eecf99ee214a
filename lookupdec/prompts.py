"""A prompt as the token ids a model decodes: token ids as given, text and chat messages through
the tokenizer (and its chat template)."""
from __future__ import annotations

import numbers
from typing import Sequence

from lookupdec.decoder_args import checked_text


def _token_ids(prompt) -> list[int] | None:
    """``prompt`` as token ids when it is a list or tuple of integers or a 1-D integer array or tensor; else None."""
    if getattr(prompt, "ndim", None) == 1 and str(getattr(prompt, "dtype", "")).removeprefix("torch.").startswith(
            ("int", "uint")):
        return [int(t) for t in prompt.tolist()]
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                                 for t in prompt):
        return [int(t) for t in prompt]
    return None


def encode_prompt(tokenizer, prompt, chat_template: bool = True) -> list[int]:
    """Token ids of a prompt.

    Args:
        tokenizer: a transformers tokenizer.
        prompt: a string (a single user turn when templated), a list of
            ``{"role", "content"}`` messages, or token ids (used as-is): a list or
            tuple of integers, or a 1-D integer numpy array or torch tensor.
        chat_template: apply the tokenizer's chat template (with the generation
            prompt) when it has one.
    Returns:
        The prompt's token ids.
    Raises:
        TypeError: the prompt is none of the accepted forms.
        ValueError: a message list without a chat template to render it, or an empty prompt.
    Example:
        >>> encode_prompt(tok, [1, 2, 3])          # doctest: +SKIP
        [1, 2, 3]
    """
    ids = _token_ids(prompt)
    if ids is None:
        ids = _encode_text(tokenizer, prompt, chat_template)
    if not ids:
        raise ValueError("the prompt is empty; give at least one token")
    return ids


def _encode_text(tokenizer, prompt, chat_template: bool) -> list[int]:
    """Token ids of a string or chat-message prompt (``encode_prompt``'s other forms)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if isinstance(prompt, str):
        checked_text(prompt, "the prompt")
        if chat_template and has_template:
            return _apply_template(tokenizer, [{"role": "user", "content": prompt}])
        return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
        if not has_template:
            raise ValueError("chat messages need a tokenizer with a chat template; pass a plain string prompt instead")
        for i, m in enumerate(prompt):
            if "role" not in m or "content" not in m:
                raise ValueError(f"each chat message needs 'role' and 'content', got {m!r}")
            if not isinstance(m["role"], str):
                raise TypeError(f"message {i}'s role must be a string, got {type(m['role']).__name__}")
            if isinstance(m["content"], str):
                checked_text(m["content"], f"message {i}'s content")
            elif not isinstance(m["content"], list):  # a list of parts is the template's to render
                raise TypeError(f"message {i}'s content must be a string, got {type(m['content']).__name__}")
        return _apply_template(tokenizer, list(prompt))
    if getattr(prompt, "ndim", 1) != 1:
        raise TypeError(f"a prompt of token ids must be 1-D, got {prompt.ndim} dimensions; pass one row (ids[0]), "
                        "and several prompts to generate_batch")
    raise TypeError("prompt must be a str, a list of chat messages or token ids (a list of integers or a 1-D "
                    f"integer array), got {type(prompt).__name__}")


def _apply_template(tokenizer, messages: Sequence[dict]) -> list[int]:
    try:
        out = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    except Exception as exc:  # the template is the model's own code: any error is about these messages
        raise ValueError(f"the model's chat template cannot render these messages ({type(exc).__name__}: {exc}); "
                         "give each message a string content") from exc
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]
