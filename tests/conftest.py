"""Shared fixtures: tiny random-weight models built in the test process (nothing downloaded)."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
torch.set_num_threads(1)  # tiny models are launch-bound: more threads only add contention

from ddtree.testing import tiny_hybrid_target, tiny_target  # noqa: E402


@pytest.fixture(scope="session", params=["qwen3", "llama"])
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def tiny_models():
    """One tiny model per family, shared by the whole session (they are never mutated)."""
    return {**{name: tiny_target(name) for name in ("qwen3", "llama")}, "qwen35": tiny_hybrid_target()}
