"""Every test in this folder runs offline, on local fixtures, with throwaway caches."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Forbid hub access and point every cache at an empty folder.

    ``datasets`` and ``huggingface_hub`` read the environment once, at import, so the module
    constants are patched as well as the variables: a cached copy of a benchmark on this
    machine must not make a test pass that would fail elsewhere.
    """
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))


@pytest.fixture
def fixtures() -> Path:
    """The folder of tiny made-up datasets in their hub column layouts."""
    return FIXTURES
