"""Bad input said in one line: what was wrong, which file or knob, and what to do.

Every entry point in ``experiments/`` runs its main through ``run_cli``. An error that a bad
input causes (a knob out of range, a config name or key that does not exist, a missing or
truncated file, a malformed prompt file, a run that decoded nothing) is printed as one line on
stderr, ``error: ...``, and the process exits with status 2; any other exception (a bug) keeps
its traceback. ``HYDRA_FULL_ERROR=1`` shows the traceback of every error, as in any Hydra app.

    >>> one_line(ValueError("tree budget must be a non-negative integer, got -1"))
    'tree budget must be a non-negative integer, got -1'
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, NoReturn

DEBUG_ENV = "HYDRA_FULL_ERROR"
EXIT_BAD_INPUT = 2


class NothingDecodedError(RuntimeError):
    """A run that had prompts to decode and decoded none of them (every one skipped)."""


def run_cli(main: Callable[[], Any], knob_advice: str | None = None) -> NoReturn:
    """Run an entry point's ``main``; a bad input exits with one line instead of a traceback.

    ``main`` returns an exit status (None is 0). Hydra is told to raise rather than print its own
    report, so that its config errors get the same one line; ``HYDRA_FULL_ERROR=1`` keeps every
    traceback. ``knob_advice`` ends the line of an override naming a knob the config lacks. A
    Hydra app also decorates its task function with ``reported`` (Hydra prints a line of its own
    for an error raised inside the task).
    """
    global _debug
    _debug = os.environ.get(DEBUG_ENV) == "1"
    os.environ[DEBUG_ENV] = "1"  # Hydra re-raises; the line below is the only report
    try:
        status = main()
    except Exception as err:
        _exit(err, knob_advice)
    raise SystemExit(status or 0)


def reported(task: Callable[..., Any]) -> Callable[..., Any]:
    """A Hydra task function whose bad-input errors exit with one line (put it under ``@hydra.main``)."""

    @functools.wraps(task)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return task(*args, **kwargs)
        except Exception as err:
            _exit(err)

    return wrapped


_debug: bool | None = None  # HYDRA_FULL_ERROR as the user set it (run_cli sets it for Hydra)


def _exit(err: Exception, knob_advice: str | None = None) -> NoReturn:
    debug = _debug if _debug is not None else os.environ.get(DEBUG_ENV) == "1"
    message = None if debug else one_line(err, knob_advice)
    if message is None:
        raise err
    print(f"error: {message} (HYDRA_FULL_ERROR=1 shows the traceback)", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT) from None


def one_line(err: BaseException, knob_advice: str | None = None) -> str | None:
    """The message for an error a bad input causes, on one line; None for anything else (a bug)."""
    if type(err).__module__.split(".")[0] in ("hydra", "omegaconf"):  # composing or reading a config
        from ddtree.presets import config_error

        return _flat(config_error(err, knob_advice))
    if isinstance(err, (ValueError, OSError, NothingDecodedError)) or _is_user_error(err):
        return _flat(str(err))
    return None


def _is_user_error(err: BaseException) -> bool:
    """Errors of the file formats the library reads (safetensors headers, dataset files)."""
    names = {f"{c.__module__}.{c.__name__}" for c in type(err).__mro__}
    return bool(names & {"safetensors._safetensors_rust.SafetensorError", "datasets.exceptions.DatasetsError"})


def _flat(text: str) -> str:
    """One line: the message's lines joined, runs of blanks squeezed."""
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())
