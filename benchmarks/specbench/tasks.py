"""Spec-Bench's questions and its six tasks, and the harness's code workload.

The question file holds one JSON object per line: ``question_id``,
``category`` and ``turns`` (one or two user messages). Spec-Bench reports six
tasks; its eight MT-bench categories form the first one, every other category
is a task of its own. The code workload (category and task ``code``) has a
question file of its own in the same format.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

# Spec-Bench's 480 questions, where the workplace keeps them (beside the checkout).
DEFAULT_QUESTIONS = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench_question.jsonl"
# Spec-Bench groups these eight MT-bench categories into the task "mt_bench".
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# The six tasks in Spec-Bench's reporting order.
SPEC_BENCH_TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
# Every task the harness knows: Spec-Bench's, then the code workload (benchmarks/data/code_questions.jsonl:
# writing and editing Python, prompts not taken from any indexed corpus).
TASKS = SPEC_BENCH_TASKS + ("code",)
# Short column headers for the Markdown table, in TASKS order.
TASK_TITLES = {
    "mt_bench": "MT-bench",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "QA",
    "math_reasoning": "Math",
    "rag": "RAG",
    "code": "Code",
}


@dataclass(frozen=True)
class Question:
    """One Spec-Bench question.

    Attributes:
        question_id: the id in the question file.
        category: the file's category (e.g. "roleplay", "rag").
        task: the Spec-Bench task the category belongs to (one of ``TASKS``).
        turns: the user messages; the second turn (MT-bench only) is asked with
            the first question and the model's first answer in the context.
    """

    question_id: int
    category: str
    task: str
    turns: tuple[str, ...]


def task_of(category: str) -> str:
    """The Spec-Bench task of a question category.

    Raises:
        ValueError: for a category that is neither an MT-bench category nor a task.

    Example:
        >>> task_of("roleplay"), task_of("rag")
        ('mt_bench', 'rag')
    """
    if category in MT_BENCH_CATEGORIES:
        return "mt_bench"
    if category in TASKS and category != "mt_bench":
        return category  # the category names its task (translation, ..., rag, code)
    raise ValueError(
        f"unknown Spec-Bench category {category!r}; expected one of {MT_BENCH_CATEGORIES + TASKS[1:]}"
    )


def load_questions(path: str | Path, per_category: int | None = None,
                   tasks: Sequence[str] | None = None, offset: int = 0) -> list[Question]:
    """Read the question file, keeping the first ``per_category`` of each category.

    Args:
        path: a Spec-Bench ``question.jsonl``.
        per_category: how many questions of each category to keep, in file
            order; ``None`` keeps all.
        tasks: keep only questions of these tasks (names from ``TASKS``);
            ``None`` keeps every task.
        offset: skip the first ``offset`` questions of each category (held-out
            questions: ``offset=1`` with ``per_category=1`` takes each category's second).

    Returns:
        The selected questions in file order.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        ValueError: for a malformed line (named by file and line number), an
            unknown category or task, a question without turns, or ``per_category < 1``.

    Example:
        >>> qs = load_questions("../shared/data/spec_bench_question.jsonl", per_category=1)  # doctest: +SKIP
        >>> [q.category for q in qs][:3]  # doctest: +SKIP
        ['writing', 'roleplay', 'reasoning']
    """
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if per_category is not None and per_category < 1:
        raise ValueError(f"per_category must be at least 1, got {per_category}; omit it to keep every question")
    if tasks is not None:
        unknown = sorted(set(tasks) - set(TASKS))
        if unknown or not tasks:
            raise ValueError(f"unknown task(s) {unknown or tasks!r}; choose from {', '.join(TASKS)}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Spec-Bench question file not found: {path}; pass --questions PATH")
    kept: dict[str, int] = defaultdict(int)
    skipped: dict[str, int] = defaultdict(int)
    out: list[Question] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                qid, category, turns = int(obj["question_id"]), str(obj["category"]), obj["turns"]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: not a Spec-Bench question ({exc})") from None
            if not turns or not all(isinstance(t, str) for t in turns):
                raise ValueError(f"{path}:{lineno}: question {qid} needs a non-empty list of string turns")
            task = task_of(category)
            if tasks is not None and task not in tasks:
                continue
            if skipped[category] < offset:
                skipped[category] += 1
                continue
            if per_category is not None and kept[category] >= per_category:
                continue
            kept[category] += 1
            out.append(Question(qid, category, task, tuple(turns)))
    return out
