"""Everything that knows transformers internals lives here."""

from ddtree.models.dflash import DFlashConfig, DFlashDraftModel
from ddtree.models.target import HFTarget

__all__ = ["DFlashConfig", "DFlashDraftModel", "HFTarget"]
