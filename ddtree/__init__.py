"""ddtree: composable speculative decoding.

AR, MTP, DFlash and DDTree are four configurations of one loop (``SpeculativeEngine``) built
from four parts: a ``Drafter``, a ``TreeBuilder``, a ``MaskCompiler`` and a ``Verifier``.
``ddtree.load(strategy, ...)`` builds one from its preset (``configs/experiment/``):

    >>> engine = ddtree.load("ddtree", budget=64)        # the shipped pair     # doctest: +SKIP
    >>> engine.generate("def fibonacci(n):", max_new_tokens=64).tokens        # doctest: +SKIP
"""

from ddtree.engine import ContextLengthError, RoundRecord, SpeculativeEngine
from ddtree.interfaces import Drafter, MaskCompiler, Target, TreeBuilder, Verifier
from ddtree.types import FINAL_NORM, Draft, GenerationResult, StageTimes, TargetOutput, Tree, Verification, VerifyInputs

__version__ = "0.1.0"



def __getattr__(name: str):
    # ddtree.load and ddtree.presets import Hydra and the evaluation code only when first used.
    if name in ("load", "presets"):
        import importlib

        presets = importlib.import_module("ddtree.presets")
        return presets.load if name == "load" else presets
    raise AttributeError(f"module 'ddtree' has no attribute {name!r}")


__all__ = [
    "FINAL_NORM",
    "ContextLengthError",
    "Draft",
    "Drafter",
    "GenerationResult",
    "MaskCompiler",
    "RoundRecord",
    "SpeculativeEngine",
    "StageTimes",
    "Target",
    "TargetOutput",
    "Tree",
    "TreeBuilder",
    "Verification",
    "Verifier",
    "VerifyInputs",
    "load",
]
