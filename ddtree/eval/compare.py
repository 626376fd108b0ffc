"""Several strategies over the same prompts, taking turns on every prompt: the main job's table.

Each contender is one strategy at one temperature with its own run directory in the records
format of ``experiments/run.py`` (``run.json`` + ``records.jsonl``), so ``make_tables.py`` reads
both and a rerun resumes where it stopped. Strategies take turns on every prompt (rather than
one strategy over all prompts, then the next), so load that drifts on a shared machine spreads
over all of them alike. A time cap stops taking new prompts and says what it cut.

``ddtree.presets.run_comparison`` does it all from preset names (the main job and the pair
pipeline's evaluate stage are calls of it).

    >>> summary = compare(contenders, tokenizer, prompts, RunSettings(max_new_tokens=96))   # doctest: +SKIP
    >>> print(format_table(table_rows(contenders), "humaneval"))                             # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Sequence

from tqdm.auto import tqdm

from ddtree.data import Prompt, encode_turn
from ddtree.engine import SpeculativeEngine
from ddtree.eval.build import describe_parts
from ddtree.eval.records import RecordWriter, Shard, check_run_dir, read_records, write_json
from ddtree.eval.runner import WARMUP_PROMPT, RunSettings, RunSummary, run_prompt
from ddtree.metrics import mean_of_means

COLUMNS = ("tau: mean acceptance length per round (bonus included), averaged over responses; "
           "tok/s: output tokens over decode time; speedup: AR's mean time per output token over "
           "this one's, same temperature; n: responses")


@dataclass
class Contender:
    """One strategy at one temperature, and where its records go."""

    label: str  # the name in the table, e.g. "ddtree-16"
    preset: str | None  # the preset it was composed from (configs/experiment/), e.g. "ddtree"
    temperature: float
    engine: SpeculativeEngine
    run_dir: Path
    identity: dict  # the resolved config that defines its responses (run.json; checked on resume)
    meta: dict = field(default_factory=dict)  # model, dataset, ... for run.json

    @property
    def key(self) -> tuple[str, float]:
        return self.label, self.temperature

    def records(self) -> list[dict]:
        return sorted(read_records(self.run_dir).values(), key=lambda r: (r["index"], r["turn"]))


@dataclass
class CompareSummary:
    decoded: int = 0  # prompts every contender has answered
    total: int = 0
    cut_by_time: bool = False
    per_contender: dict[tuple[str, float], RunSummary] = field(default_factory=dict)  # by (label, temperature)


def compare(contenders: Sequence[Contender], tokenizer, prompts: Sequence[Prompt], settings: RunSettings,
            max_seconds: float = float("inf"), desc: str = "prompts") -> CompareSummary:
    """Decode every prompt with every contender in turn, skipping recorded responses."""
    summary = CompareSummary(total=len(prompts))
    for c in contenders:
        check_run_dir(c.run_dir, c.identity)
        write_json(c.run_dir / "run.json", {"config": c.identity, "parts": describe_parts(c.engine),
                                            "strategy": c.label, "preset": c.preset, **c.meta})
        summary.per_contender[c.key] = RunSummary()
    done = {c.key: read_records(c.run_dir) for c in contenders}
    todo = [p for p in prompts if any(f"{p.index}:0" not in done[c.key] for c in contenders)]
    if todo and settings.warmup_tokens > 0:  # lazy initialisation is nobody's decode time
        for c in contenders:
            c.engine.generate(encode_turn(tokenizer, WARMUP_PROMPT), max_new_tokens=settings.warmup_tokens)
    writers = {c.key: RecordWriter(c.run_dir / "records.jsonl") for c in contenders}
    start = time.perf_counter()
    bar = tqdm(prompts, desc=desc, disable=not settings.progress, dynamic_ncols=True)
    try:
        for i, prompt in enumerate(bar):
            if i > 0 and time.perf_counter() - start > max_seconds and prompt in todo:
                summary.cut_by_time = True
                break
            for c in contenders:
                run_prompt(c.engine, tokenizer, prompt, writers[c.key], done[c.key], settings,
                           Shard(), summary.per_contender[c.key])
            summary.decoded = i + 1
    finally:
        bar.close()
        for writer in writers.values():
            writer.close()
    return summary


@dataclass(frozen=True)
class Row:
    strategy: str
    temperature: float
    tau: float  # mean over responses of the per-response mean acceptance length
    tokens_per_second: float  # output tokens over decode time, all responses pooled
    tpot: float  # mean over responses of the time per output token (s)
    speedup: float  # mean TPOT(AR) / mean TPOT(this), same temperature; nan without an AR contender
    responses: int


def table_rows(contenders: Sequence[Contender]) -> list[Row]:
    """One row per contender, from its records (so a resumed run's table covers every response)."""
    records = {id(c): c.records() for c in contenders}
    tpot = {id(c): fmean(r["tpot"] for r in records[id(c)]) if records[id(c)] else float("nan") for c in contenders}
    base = {c.temperature: tpot[id(c)] for c in contenders if c.preset == "ar"}
    rows = []
    for c in contenders:
        rs = records[id(c)]
        tokens, seconds = sum(len(r["tokens"]) for r in rs), sum(r["decode_time"] for r in rs)
        speedup = base.get(c.temperature, float("nan")) / tpot[id(c)] if tpot[id(c)] > 0 else float("nan")
        rows.append(Row(c.label, c.temperature, mean_of_means(r["acceptance_lengths"] for r in rs),
                        tokens / seconds if seconds > 0 else float("nan"), tpot[id(c)], speedup, len(rs)))
    return rows


def format_table(rows: Sequence[Row], title: str = "") -> str:
    """A plain-text table, one line per (strategy, temperature), and what the columns mean."""
    lines = [title] if title else []
    lines.append(f"{'strategy':<12} {'T':>4} {'tau':>6} {'tok/s':>9} {'speedup':>8} {'n':>4}")
    for r in rows:
        lines.append(f"{r.strategy:<12} {r.temperature:>4.1f} {r.tau:>6.2f} {r.tokens_per_second:>9.1f} "
                     f"{r.speedup:>7.2f}x {r.responses:>4}")
    lines.append(COLUMNS)
    return "\n".join(lines)
