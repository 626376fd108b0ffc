"""Mask compilers: the attention layout of a tree verify."""

from ddtree.masks.dense import DenseMaskCompiler
from ddtree.masks.tree import TreeMaskCompiler, additive_tree_mask

__all__ = ["DenseMaskCompiler", "TreeMaskCompiler", "additive_tree_mask"]
