"""The environment of a child Python that the benchmarks start from this checkout.

The checkout goes ahead of the caller's own PYTHONPATH, which is kept: packages installed
through it (a ``pip install --target`` directory, as on a machine where nothing else may be
installed) stay importable in the child. Replacing PYTHONPATH with the checkout lost them.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def checkout_env(*first: str, **extra: str) -> dict[str, str]:
    """``os.environ`` with ``first`` and the checkout ahead on PYTHONPATH (the caller's entries kept
    after them), and ``extra`` set. The tests start their children with it too (``tests/conftest.py``).

    Example:
        >>> env = checkout_env(LOOKUPDEC_CACHE="/tmp/c")
        >>> env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO), env["LOOKUPDEC_CACHE"]
        (True, '/tmp/c')
    """
    path = os.pathsep.join(p for p in (*first, str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}
