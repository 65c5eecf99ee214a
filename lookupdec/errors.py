"""The exceptions lookupdec raises for user errors.

Every message names the bad value and says how to fix it. Internal invariants
use ``assert``; these are for things a user can get wrong.
"""


class LookupdecError(Exception):
    """Base class of every user-facing lookupdec error."""


class CorpusError(LookupdecError, ValueError):
    """A corpus file is missing, unreadable, malformed or empty."""


class IndexFormatError(LookupdecError, ValueError):
    """An index directory is missing, incomplete, corrupted or of another format."""


class TokenizerMismatchError(LookupdecError, ValueError):
    """An index was built with a different tokenizer than the one in use."""


class PromptError(LookupdecError, ValueError):
    """A prompt the model cannot take: a token id outside its vocabulary, or too long for its context."""


class ContextTooLongError(PromptError):
    """A prompt (plus the tokens to generate) does not fit the model's context.

    Its message names both lengths and the largest ``max_new_tokens`` that fits; ``worded``
    names the limit as a caller's own interface does (the server: the request's field).

    Attributes:
        prompt_tokens, max_new_tokens, max_context: the lengths that did not fit.

    Example:
        >>> err = ContextTooLongError(250, 10, 256)
        >>> str(err)
        "the prompt takes 250 tokens and max_new_tokens is 10: 260 > the model's context of 256 tokens; ..."
        >>> err.worded("max_tokens")[-30:]
        'or set max_tokens to at most 6'
    """

    def __init__(self, prompt_tokens: int, max_new_tokens: int, max_context: int) -> None:
        self.prompt_tokens, self.max_new_tokens, self.max_context = prompt_tokens, max_new_tokens, max_context
        super().__init__(self.worded("max_new_tokens"))

    def __reduce__(self):  # pickles by its lengths (the message alone would not rebuild it)
        return type(self), (self.prompt_tokens, self.max_new_tokens, self.max_context)

    def worded(self, limit: str | None) -> str:
        """The message with the token limit called ``limit`` (None: the caller set none, so only the
        prompt can be shortened)."""
        n, k, ctx = self.prompt_tokens, self.max_new_tokens, self.max_context
        if limit is None or n >= ctx:
            return (f"the prompt takes {n} tokens, and the model's context holds {ctx}, the tokens to generate "
                    f"included; shorten the prompt to fewer than {ctx} tokens")
        return (f"the prompt takes {n} tokens and {limit} is {k}: {n + k} > the model's context of {ctx} "
                f"tokens; shorten the prompt or set {limit} to at most {ctx - n}")


class ModelLoadError(LookupdecError):
    """A model could not be found or loaded."""


class DraftError(LookupdecError, ValueError):
    """A drafter proposed something the verifier cannot take (a token outside the vocabulary, ...)."""
