"""Response records: one JSON line per response, appended atomically, resumable, one file per rank.

A run directory holds ``run.json`` (what ran: the config's identity and the parts it built) and
the records, ``records.jsonl`` for a single process or ``records.rank{r}-of-{w}.jsonl`` for each
rank of a data-parallel run. Every line is one finished response; a crash can at worst leave a
torn last line, which the reader drops and the writer repairs. Nothing is ever pickled.

    >>> shard = Shard.from_env()                                   # RANK / WORLD_SIZE, or 0 / 1
    >>> done = read_records(run_dir)                               # doctest: +SKIP
    >>> with RecordWriter(run_dir / shard.records_name) as out:     # doctest: +SKIP
    ...     out.write({"key": response_key(3, 0), "tokens": [...]})
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, TypeVar

log = logging.getLogger(__name__)

RECORDS_GLOB = "records*.jsonl"
RUN_FILE = "run.json"
T = TypeVar("T")


def response_key(index: int, turn: int) -> str:
    """A response's identity inside a run: the prompt's row in the source split, and the turn."""
    return f"{index}:{turn}"


@dataclass(frozen=True)
class Shard:
    """This process's slice of the prompts in a data-parallel run (``torchrun``/``accelerate launch``).

    >>> Shard(rank=1, world_size=2).select(["a", "b", "c"])
    ['b']
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"need 0 <= RANK < WORLD_SIZE, got RANK={self.rank} WORLD_SIZE={self.world_size}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Shard":
        """RANK, WORLD_SIZE and LOCAL_RANK as torchrun and accelerate set them (0, 1, RANK when unset)."""
        env = os.environ if env is None else env
        rank = int(env.get("RANK", 0))
        return cls(rank, int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", rank)))

    def select(self, items: Sequence[T]) -> list[T]:
        """Every ``world_size``-th item from ``rank``: shards differ by at most one item."""
        return list(items)[self.rank :: self.world_size]

    @property
    def records_name(self) -> str:
        if self.world_size == 1:
            return "records.jsonl"
        return f"records.rank{self.rank}-of-{self.world_size}.jsonl"

    def device(self, device: str) -> str:
        """``"cuda"`` becomes this process's GPU (``cuda:LOCAL_RANK``) in a data-parallel run."""
        return f"cuda:{self.local_rank}" if device == "cuda" and self.world_size > 1 else device


class RecordWriter:
    """Appends one JSON line per record; each line reaches the file whole, or (after a crash
    mid-write) is a torn tail that ``read_records`` drops and the next writer cuts off."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: Mapping[str, Any]) -> None:
        data = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
        view = memoryview(data)
        while view:  # one write for any sane line; the loop only guards against short writes
            view = view[os.write(self._fd, view):]
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cut_torn_tail(path: Path) -> None:
    """Drop an unterminated last line (a write the process did not finish)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    keep = data.rfind(b"\n") + 1
    log.warning("%s: dropping a torn last line (%d bytes) left by an interrupted write", path, len(data) - keep)
    with open(path, "r+b") as f:
        f.truncate(keep)


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of one file. A torn last line is dropped; a broken line elsewhere is an error."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):  # unterminated tail: an interrupted append
                log.warning("%s: ignoring a torn last line", path)
                continue
            raise ValueError(f"{path}:{number} is not a JSON record ({err}); the file is damaged") from err
    return records


def read_records(run_dir: str | Path) -> dict[str, dict]:
    """Every finished response of a run, all ranks gathered, by ``key`` (first occurrence wins)."""
    records: dict[str, dict] = {}
    for file in sorted(Path(run_dir).glob(RECORDS_GLOB)):
        for record in read_jsonl(file):
            records.setdefault(record["key"], record)
    return records


def write_json(path: str | Path, data: Any) -> None:
    """Write a JSON file atomically: a temporary file in the same folder, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


class RunMismatchError(RuntimeError):
    """A run directory already holds records of a different configuration."""


def check_run_dir(run_dir: str | Path, config: Mapping[str, Any]) -> None:
    """Refuse to resume into a directory whose records came from another config.

    ``config`` is the run's identity (the resolved config, minus knobs that do not change the
    responses, such as ``stop_after``). The first run writes it into ``run.json``.
    """
    file = Path(run_dir) / RUN_FILE
    if not file.exists():
        return
    before = json.loads(file.read_text()).get("config", {})
    changed = sorted(_diff(before, dict(config)))
    if changed:
        shown = "; ".join(changed[:6]) + (" ..." if len(changed) > 6 else "")
        raise RunMismatchError(
            f"{run_dir} holds records of a different config ({shown}). Resuming would mix them: "
            "pass another hydra.run.dir / hydra.sweep.dir, or delete that directory."
        )


def _diff(a: Any, b: Any, prefix: str = "") -> Iterable[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a.keys() | b.keys():
            yield from _diff(a.get(key), b.get(key), f"{prefix}{key}.")
    elif a != b:
        yield f"{prefix.rstrip('.')}: {a!r} -> {b!r}"
