"""Everything that knows transformers internals lives here."""

from ddtree.models.dflash import DFlashConfig, DFlashDraftModel
from ddtree.models.dispatch import target_for
from ddtree.models.hybrid import HybridTarget
from ddtree.models.mtp import MTPHead
from ddtree.models.target import HFTarget

__all__ = ["DFlashConfig", "DFlashDraftModel", "HFTarget", "HybridTarget", "MTPHead", "target_for"]
