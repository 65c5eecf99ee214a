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

    Attributes:
        prompt_tokens, max_new_tokens, max_context: the lengths that did not fit (None when not
            given), so that a caller can word the error in its own terms (the server names the
            request's own fields).
    """

    def __init__(self, message: str, *, prompt_tokens: int | None = None, max_new_tokens: int | None = None,
                 max_context: int | None = None) -> None:
        super().__init__(message)
        self.prompt_tokens, self.max_new_tokens, self.max_context = prompt_tokens, max_new_tokens, max_context


class ModelLoadError(LookupdecError):
    """A model could not be found or loaded."""


class DraftError(LookupdecError, ValueError):
    """A drafter proposed something the verifier cannot take (a token outside the vocabulary, ...)."""
