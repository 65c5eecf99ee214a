"""The reference documents a Spec-Bench prompt carries inside it.

Methods that draft from caller-given documents (LLMA) receive them as
``references``; the prompt itself is unchanged, so every method sees the same
tokens. Two tasks carry documents:

- summarization: ``"Summarize: <article>"``; the article is the document;
- rag: retrieved passages, one per line, then the question on the last line;
  each passage line is a document.
"""
from __future__ import annotations

SUMMARIZE_PREFIX = "Summarize:"
# The tasks whose prompts carry documents (what llma drafts from).
DOCUMENT_TASKS = ("summarization", "rag")


def extract_documents(task: str, prompt: str) -> tuple[str, ...]:
    """The documents inside a Spec-Bench prompt.

    Args:
        task: the question's Spec-Bench task (see ``tasks.TASKS``).
        prompt: the user message of the turn.

    Returns:
        The documents, in prompt order; ``()`` for tasks without documents.

    Raises:
        ValueError: when a summarization prompt lacks the ``"Summarize:"``
            prefix or a rag prompt has no passage before its question, so a
            changed question file cannot silently turn documents off.

    Example:
        >>> extract_documents("summarization", "Summarize: The fox ran.")
        ('The fox ran.',)
        >>> extract_documents("rag", "Fox. A fox is an animal.\\nBee. Bees fly.\\nWhat is a fox?")
        ('Fox. A fox is an animal.', 'Bee. Bees fly.')
        >>> extract_documents("qa", "Who wrote Hamlet?")
        ()
    """
    if task == "summarization":
        if not prompt.startswith(SUMMARIZE_PREFIX):
            raise ValueError(
                f"summarization prompt does not start with {SUMMARIZE_PREFIX!r}: {prompt[:60]!r}; "
                "update extract_documents for this question file"
            )
        article = prompt[len(SUMMARIZE_PREFIX):].strip()
        return (article,) if article else ()
    if task == "rag":
        lines = [line.strip() for line in prompt.split("\n")]
        passages = tuple(line for line in lines[:-1] if line)
        if not passages:
            raise ValueError(
                f"rag prompt has no passage line before its question: {prompt[:60]!r}; "
                "expected passages one per line, then the question"
            )
        return passages
    return ()
