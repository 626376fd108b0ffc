"""The runner: one record per response, resume without recomputation, turns, skips, shards."""

from __future__ import annotations

import json
import logging

import pytest

from ddtree.data import Prompt
from ddtree.drafters import NullDrafter
from ddtree.eval import RecordWriter, RunSettings, Shard, build_engine, eos_stop_tokens, read_records, run_prompts
from ddtree.masks import DenseMaskCompiler
from ddtree.metrics import mean_of_means
from ddtree.models import HFTarget
from ddtree.testing import tiny_dflash_drafter, tiny_tokenizer
from ddtree.trees import BestFirstTreeBuilder
from ddtree.verifiers import SamplingVerifier

SETTINGS = RunSettings(max_new_tokens=12, warmup_tokens=2, progress=False)


def prompts(n: int = 4) -> list[Prompt]:
    out = [Prompt(id=f"p{i}", dataset="jsonl", turns=(f"Prompt number {i}.",), index=i) for i in range(n)]
    return out + [Prompt(id="two", dataset="jsonl", turns=("Name a fruit.", "And a vegetable?"), index=n)]


@pytest.fixture
def engine(tiny_models):
    target = HFTarget(tiny_models["qwen3"], max_length=200)
    return build_engine(target, tiny_dflash_drafter, BestFirstTreeBuilder(6), DenseMaskCompiler(),
                        SamplingVerifier(1.0), eos_stop_tokens(tiny_tokenizer()))


def run(engine, run_dir, items, settings=SETTINGS, shard=Shard()):
    with RecordWriter(run_dir / shard.records_name) as out:
        return run_prompts(engine, tiny_tokenizer(), items, out, read_records(run_dir), settings, shard)


def test_one_record_per_response_with_the_protocols_fields(engine, tmp_path) -> None:
    summary = run(engine, tmp_path, prompts())
    records = read_records(tmp_path)
    assert summary.computed == len(records) == 6 and not summary.skipped
    r = records["4:1"]  # second turn of the two-turn prompt
    assert (r["prompt_id"], r["turn"], r["rank"]) == ("two", 1, 0)
    assert 1 <= len(r["tokens"]) <= SETTINGS.max_new_tokens
    assert r["tau"] == pytest.approx(mean_of_means([r["acceptance_lengths"]]))
    assert r["tpot"] == pytest.approx(r["decode_time"] / len(r["tokens"]))
    assert set(r["stage_times"]) == {"draft", "tree", "layout", "verify", "commit"}


def test_an_interrupted_run_resumes_without_recomputing(engine, tmp_path) -> None:
    first = run(engine, tmp_path, prompts(), RunSettings(**{**vars(SETTINGS), "stop_after": 2}))
    assert first.stopped_early and first.computed == 2
    before = (tmp_path / "records.jsonl").read_text()
    second = run(engine, tmp_path, prompts())
    assert (second.computed, second.reused) == (4, 2)
    after = (tmp_path / "records.jsonl").read_text()
    assert after.startswith(before)  # the finished records are untouched, nothing recomputed
    keys = [json.loads(line)["key"] for line in after.splitlines()]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == 6
    assert run(engine, tmp_path, prompts()).computed == 0


def test_resume_gives_the_same_responses_as_one_pass(engine, tmp_path) -> None:
    # Per-response seeds: interruption and sharding do not change what is sampled (T = 1 here).
    run(engine, tmp_path / "once", prompts())
    run(engine, tmp_path / "twice", prompts(), RunSettings(**{**vars(SETTINGS), "stop_after": 3}))
    run(engine, tmp_path / "twice", prompts())
    for rank in range(2):
        run(engine, tmp_path / "sharded", prompts(), shard=Shard(rank, 2))
    once = read_records(tmp_path / "once")
    for other in ("twice", "sharded"):
        assert {k: r["tokens"] for k, r in read_records(tmp_path / other).items()} == \
               {k: r["tokens"] for k, r in once.items()}
    assert {r["rank"] for r in read_records(tmp_path / "sharded").values()} == {0, 1}


def test_a_later_turn_conditions_on_the_recorded_reply(engine, tmp_path) -> None:
    run(engine, tmp_path, prompts(0))
    records = (tmp_path / "records.jsonl").read_text().splitlines()
    # Drop turn 2 and resume: the reply to turn 1 comes from its record, turn 2 is the same again.
    (tmp_path / "records.jsonl").write_text(records[0] + "\n")
    assert run(engine, tmp_path, prompts(0)).computed == 1
    assert read_records(tmp_path)["0:1"]["tokens"] == json.loads(records[1])["tokens"]


def test_a_prompt_longer_than_the_context_is_skipped_and_named(engine, tmp_path, caplog) -> None:
    long = Prompt(id="too-long", dataset="jsonl", turns=("x" * 300, "follow-up"), index=9)
    with caplog.at_level(logging.WARNING):
        summary = run(engine, tmp_path, [*prompts(1), long])
    assert summary.computed == 3 and len(summary.skipped) == 1
    assert "too-long (turn 0)" in summary.skipped[0] and "context of 200 tokens" in summary.skipped[0]
    assert "skipping prompt too-long (turn 0)" in caplog.text
    assert "9:0" not in read_records(tmp_path) and "9:1" not in read_records(tmp_path)


def test_ar_runs_through_the_same_loop(tiny_models, tmp_path) -> None:
    target = HFTarget(tiny_models["llama"])
    engine = build_engine(target, NullDrafter(), BestFirstTreeBuilder(4), DenseMaskCompiler(), SamplingVerifier(0.0),
                          eos_stop_tokens(tiny_tokenizer()))
    run(engine, tmp_path, prompts(2))
    assert all(set(r["acceptance_lengths"]) <= {1} for r in read_records(tmp_path).values())


def test_the_settings_accounting_reaches_generate(engine, tmp_path) -> None:
    from ddtree.data import encode_turn
    from ddtree.metrics import ReferenceAccounting

    settings = RunSettings(**{**vars(SETTINGS), "accounting": ReferenceAccounting()})
    run(engine, tmp_path, prompts(1), settings)
    record = read_records(tmp_path)["0:0"]
    direct = engine.generate(encode_turn(tiny_tokenizer(), "Prompt number 0."), max_new_tokens=12,
                             seed=record["seed"], accounting=ReferenceAccounting())
    assert (record["tokens"], record["acceptance_lengths"]) == (direct.tokens, direct.acceptance_lengths)
    exact = engine.generate(encode_turn(tiny_tokenizer(), "Prompt number 0."), max_new_tokens=12, seed=record["seed"])
    assert exact.tokens == direct.tokens and exact.acceptance_lengths != direct.acceptance_lengths  # one round more


def test_rounds_are_recorded_only_when_asked(engine, tmp_path) -> None:
    from ddtree.metrics.rounds import traces_of

    run(engine, tmp_path / "plain", prompts(1))
    assert "rounds" not in read_records(tmp_path / "plain")["0:0"]
    run(engine, tmp_path / "rounds", prompts(1), RunSettings(**{**vars(SETTINGS), "record_rounds": True}))
    record = read_records(tmp_path / "rounds")["0:0"]
    traces = traces_of(record)
    assert [t.length for t in traces] == record["acceptance_lengths"]
    assert all(t.path[0] == 0 and t.size <= 7 and len(t.top) >= max(t.depths) for t in traces)
