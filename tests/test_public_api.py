"""The names the README documents are importable from ``lookupdec`` itself."""
from __future__ import annotations

import lookupdec


def test_protocol_and_error_types_are_exported():
    from lookupdec.costs import CostCurve
    from lookupdec.drafters.saved import StateFile
    from lookupdec.drafters.base import Drafter, DraftRequest, StepOutcome
    from lookupdec.index.history import HistoryError
    from lookupdec.index.outdir import BuildError

    assert lookupdec.Drafter is Drafter and lookupdec.DraftRequest is DraftRequest
    assert lookupdec.StepOutcome is StepOutcome and lookupdec.CostCurve is CostCurve
    assert lookupdec.StateFile is StateFile  # what Decoder.save_state / load_state return
    assert issubclass(lookupdec.HistoryError, lookupdec.LookupdecError) and lookupdec.HistoryError is HistoryError
    assert issubclass(lookupdec.BuildError, lookupdec.LookupdecError) and lookupdec.BuildError is BuildError


def test_the_ray_build_does_not_import_the_local_build_module():
    # The two builds share IndexSummary through lookupdec.index.summary; ray_build must not
    # import lookupdec.index.build (which imports ray_build lazily): no import cycle.
    import ast
    import inspect

    import lookupdec.index.ray_build as ray_build

    tree = ast.parse(inspect.getsource(ray_build))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "lookupdec.index.build" not in imported and "lookupdec.index.summary" in imported
