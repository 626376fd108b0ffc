"""Evaluation: building an engine from instantiated parts, the benchmark runner, response
records (atomic, resumable, sharded by rank), and the paper's tables.

    >>> from ddtree.eval import build_engine, run_prompts, load_runs, cells, table_rows, to_markdown
"""

from ddtree.eval.build import bind_drafter, build_engine, describe_parts, eos_stop_tokens
from ddtree.eval.records import (
    RecordWriter,
    RunMismatchError,
    Shard,
    check_run_dir,
    read_jsonl,
    read_records,
    response_key,
    write_json,
)
from ddtree.eval.runner import RunSettings, RunSummary, run_prompts
from ddtree.eval.tables import (
    Cell,
    Run,
    cells,
    load_paper_numbers,
    load_run,
    load_runs,
    method_of,
    run_rows,
    table_rows,
    to_csv,
    to_latex,
    to_markdown,
)

__all__ = [
    "Cell", "RecordWriter", "Run", "RunMismatchError", "RunSettings", "RunSummary", "Shard",
    "bind_drafter", "build_engine", "cells", "check_run_dir", "describe_parts", "eos_stop_tokens",
    "load_paper_numbers", "load_run", "load_runs", "method_of", "read_jsonl", "read_records",
    "response_key", "run_prompts", "run_rows", "table_rows", "to_csv", "to_latex", "to_markdown",
    "write_json",
]
