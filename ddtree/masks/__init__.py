"""Mask compilers: the attention layout of a tree verify."""

from ddtree.masks.auto import AutoMaskCompiler, takes_tree_block
from ddtree.masks.dense import DenseMaskCompiler
from ddtree.masks.tree import TreeMaskCompiler, additive_tree_mask

__all__ = ["AutoMaskCompiler", "DenseMaskCompiler", "TreeMaskCompiler", "additive_tree_mask", "takes_tree_block"]
