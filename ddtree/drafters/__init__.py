"""Drafters: what proposes the tokens after the bonus token."""

from ddtree.drafters.dflash import DFlashDrafter
from ddtree.drafters.mtp import MTPDrafter
from ddtree.drafters.null import NullDrafter
from ddtree.drafters.oracle import OracleDrafter

__all__ = ["DFlashDrafter", "MTPDrafter", "NullDrafter", "OracleDrafter"]
