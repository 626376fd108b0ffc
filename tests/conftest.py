"""Shared fixtures: tiny random-weight models built in the test process (nothing downloaded)."""

import logging
import os
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
torch.set_num_threads(1)  # tiny models are launch-bound: more threads only add contention

from ddtree.testing import tiny_hybrid_target, tiny_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", params=["qwen3", "llama"])
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def tiny_models():
    """One tiny model per family, shared by the whole session (they are never mutated)."""
    return {**{name: tiny_target(name) for name in ("qwen3", "llama")}, "qwen35": tiny_hybrid_target()}


@dataclass(frozen=True)
class Result:
    """An entry point run in this process: its exit status and what it printed."""

    returncode: int | str
    stdout: str
    stderr: str


@pytest.fixture
def cli(monkeypatch, capsys):
    """``cli("main.py", *args, cwd=...)``: run an entry point as ``__main__``; its exit status and output
    (``debug=True``: as with ``HYDRA_FULL_ERROR=1``)."""

    def run(script: str, *args: str, cwd: Path, debug: bool = False) -> Result:
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", [str(ROOT / "experiments" / script), *args])
        monkeypatch.setenv("HYDRA_FULL_ERROR", "1" if debug else "0")
        handlers, level, threads = logging.root.handlers[:], logging.root.level, torch.get_num_threads()
        capsys.readouterr()
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
            code = 0
        except SystemExit as exit:
            code = 0 if exit.code is None else exit.code
        finally:  # Hydra configures logging and keeps global state, main.py sets threads: leave none behind
            from hydra.core.global_hydra import GlobalHydra

            GlobalHydra.instance().clear()
            logging.root.handlers[:] = handlers
            logging.root.setLevel(level)
            torch.set_num_threads(threads)
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


_CONFIG = {}


def pytest_configure(config) -> None:
    _CONFIG["controller"] = not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


def pytest_runtest_logreport(report) -> None:
    """A failing GPU test's traceback is written out as it fails (by the process that ran it): a GPU
    run cut off by its time limit (device time is scarce) never reaches pytest's summary, where
    tracebacks are otherwise shown."""
    if report.failed and "gpu" in report.keywords and not _CONFIG.get("controller"):
        sys.stderr.write(f"\n=== {report.nodeid} failed ({report.when}):\n{report.longreprtext[-4000:]}\n")
        sys.stderr.flush()
