"""ddtree: composable speculative decoding.

AR, MTP, DFlash and DDTree are four configurations of one loop (``SpeculativeEngine``) built
from four parts: a ``Drafter``, a ``TreeBuilder``, a ``MaskCompiler`` and a ``Verifier``.
"""

from ddtree.engine import ContextLengthError, RoundRecord, SpeculativeEngine
from ddtree.interfaces import Drafter, MaskCompiler, Target, TreeBuilder, Verifier
from ddtree.types import FINAL_NORM, Draft, GenerationResult, StageTimes, TargetOutput, Tree, Verification, VerifyInputs

__version__ = "0.1.0"

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
]
