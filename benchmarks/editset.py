"""A code-editing set for Predicted Outputs: a source file, a small change request, the edited file.

Each case takes one top-level function from a Python standard-library module (its source
read from this interpreter's own library, so the set needs no download and is the same for
a given Python version), asks for one small edit, and carries the edited file a correct
answer would be. The prediction a client would send is the original file: most of the
answer repeats it.

Edits (chosen per case in turn, skipping any that does not apply):

- ``rename-param``: rename the function's first parameter everywhere in the function;
- ``rename-function``: rename the function (its definition and recursive calls);
- ``add-docstring-line``: put a one-line comment above the ``def``.
"""
from __future__ import annotations

import ast
import difflib
import importlib.util
import re
import textwrap
from dataclasses import dataclass

# Modules whose plain top-level functions make readable files of a few dozen lines.
SOURCE_MODULES = ("textwrap", "shlex", "fnmatch", "glob", "base64", "calendar", "colorsys", "difflib", "filecmp",
                  "gettext", "heapq", "ntpath", "posixpath", "quopri", "random", "string", "tokenize", "uu",
                  "weakref", "bisect", "copy", "csv", "dis", "genericpath", "getopt", "gzip", "imghdr", "keyword",
                  "locale", "mimetypes", "netrc", "operator", "pprint", "reprlib", "sched", "shutil", "statistics")
EDITS = ("rename-param", "rename-function", "add-docstring-line")


@dataclass(frozen=True)
class EditCase:
    """One editing request.

    Attributes:
        name: ``module.function:edit``.
        source: the original file (one function).
        request: the change asked for, in words.
        edited: the file a correct answer would be.
    """

    name: str
    source: str
    request: str
    edited: str

    def messages(self) -> list[dict]:
        """The chat a client sends: the file in a code block, then the change request."""
        return [{"role": "user", "content": f"Here is a Python file:\n\n```python\n{self.source}```\n\n"
                                            f"{self.request} Reply with the whole edited file in one ```python "
                                            f"code block, and nothing else."}]

    def prediction(self) -> str:
        """What the client predicts the answer to be: the original file, as the answer would quote it."""
        return f"```python\n{self.source}```"


def kept_share(original: str, output: str) -> float:
    """The share of ``original`` that ``output`` repeats: matched characters / the original's length.

    Example:
        >>> kept_share("abcdef", "abcXdef")
        1.0
        >>> kept_share("abcdef", "abc")
        0.5
    """
    if not original:
        return 0.0
    sm = difflib.SequenceMatcher(None, original, output, autojunk=False)
    return sum(b.size for b in sm.get_matching_blocks()) / len(original)


def _functions(module_name: str, min_lines: int, max_lines: int):
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return
    with open(spec.origin, encoding="utf-8") as f:
        text = f.read()
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.decorator_list and not node.name.startswith("_"):
            n = node.end_lineno - node.lineno + 1
            if min_lines <= n <= max_lines and node.args.args:
                yield node, "".join(lines[node.lineno - 1:node.end_lineno])


def _rename(src: str, old: str, new: str) -> str:
    return re.sub(rf"(?<![\w.]){re.escape(old)}\b", new, src)


def _edit(kind: str, node: ast.FunctionDef, src: str) -> tuple[str, str] | None:
    """(request, edited source) for one edit kind, or None when it does not apply cleanly."""
    if kind == "rename-param":
        old = node.args.args[0].arg
        if old in ("self", "cls") or len(old) < 2:
            return None
        new = f"{old}_value"
        return f"Rename the parameter `{old}` of `{node.name}` to `{new}` everywhere in the function.", \
            _rename(src, old, new)
    if kind == "rename-function":
        new = f"{node.name.strip('_')}_v2"
        return f"Rename the function `{node.name}` to `{new}`.", _rename(src, node.name, new)
    if kind == "add-docstring-line":
        comment = f"# {node.name}: kept for compatibility.\n"
        return f"Add the comment line `{comment.strip()}` just above the `def` line.", comment + src
    raise ValueError(f"unknown edit {kind!r}")


def edit_cases(n: int, min_lines: int = 12, max_lines: int = 40) -> list[EditCase]:
    """The first ``n`` cases, in a fixed order (modules in ``SOURCE_MODULES`` order, edits in turn).

    Args:
        n: how many cases.
        min_lines, max_lines: the function sizes kept.
    Returns:
        Up to ``n`` ``EditCase`` objects; each keeps at least 80% of its file
        (``kept_share(source, edited) >= 0.8``) and changes it.
    """
    out: list[EditCase] = []
    k = 0
    for module in SOURCE_MODULES:
        for node, src in _functions(module, min_lines, max_lines):
            src = textwrap.dedent(src)
            for attempt in range(len(EDITS)):
                kind = EDITS[(k + attempt) % len(EDITS)]
                edit = _edit(kind, node, src)
                if edit and edit[1] != src and kept_share(src, edit[1]) >= 0.8:
                    out.append(EditCase(f"{module}.{node.name}:{kind}", src, edit[0], edit[1]))
                    k += 1
                    break
            if len(out) >= n:
                return out
            break  # one function per module keeps the set varied
    return out

