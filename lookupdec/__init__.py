"""lookupdec: lossless lookup-based speculative decoding.

Public names are imported lazily so that ``import lookupdec`` (and the
torch-free ``lookupdec.index``) stay light.
"""
from lookupdec.errors import (
    ContextTooLongError,
    CorpusError,
    DraftError,
    IndexFormatError,
    LookupdecError,
    ModelLoadError,
    PromptError,
    TokenizerMismatchError,
)
from lookupdec.tree import DraftTree

__version__ = "0.1.0"

_LAZY = {
    "build_index": "lookupdec.index",
    "open_index": "lookupdec.index",
    "SuffixIndex": "lookupdec.index",
    "Decoder": "lookupdec.decoder",
    "generate": "lookupdec.oneshot",
    "GenerationResult": "lookupdec.results",
    "Drafter": "lookupdec.drafters.base",
    "DraftRequest": "lookupdec.drafters.base",
    "StepOutcome": "lookupdec.drafters.base",
    "CostCurve": "lookupdec.costs",
    "StateFile": "lookupdec.drafters.saved",
    "HistoryError": "lookupdec.index.history",
    "BuildError": "lookupdec.index.outdir",
    "JsonSchema": "lookupdec.constraints.spec",
    "Regex": "lookupdec.constraints.spec",
    "Lark": "lookupdec.constraints.spec",
    "Choice": "lookupdec.constraints.spec",
    "ConstraintError": "lookupdec.constraints.spec",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lookupdec' has no attribute {name!r}")


__all__ = [
    "DraftTree",
    "LookupdecError",
    "CorpusError",
    "DraftError",
    "IndexFormatError",
    "TokenizerMismatchError",
    "PromptError",
    "ContextTooLongError",
    "ModelLoadError",
    *_LAZY,
]
