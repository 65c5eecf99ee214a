"""The docstring examples of the package run and hold (examples marked +SKIP need the real model)."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import lookupdec


def test_every_docstring_example_in_the_package_holds():
    attempted = 0
    failures = []
    for info in pkgutil.walk_packages(lookupdec.__path__, "lookupdec."):
        if info.name.endswith("_export_tokenizer"):  # a script run in a subprocess
            continue
        module = importlib.import_module(info.name)
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False, report=False)
        attempted += result.attempted
        if result.failed:
            failures.append(info.name)
    assert not failures, f"docstring examples fail in {failures}"
    assert attempted > 50  # the examples really ran
