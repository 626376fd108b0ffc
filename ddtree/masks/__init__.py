"""Mask compilers: the attention layout of a tree verify."""

from ddtree.masks.dense import DenseMaskCompiler

__all__ = ["DenseMaskCompiler"]
