"""Records: JSON lines appended whole, torn tails survived, ranks sharded, foreign runs refused."""

from __future__ import annotations

import json

import pytest

from ddtree.eval import RecordWriter, RunMismatchError, Shard, check_run_dir, read_jsonl, read_records, write_json


def test_records_round_trip_as_json_lines(tmp_path) -> None:
    with RecordWriter(tmp_path / "records.jsonl") as out:
        out.write({"key": "0:0", "tokens": [1, 2], "tau": 1.5})
        out.write({"key": "1:0", "tokens": [3], "tau": 1.0})
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines] == ["0:0", "1:0"]
    assert read_records(tmp_path)["0:0"]["tokens"] == [1, 2]


def test_a_torn_last_line_is_dropped_and_repaired(tmp_path, caplog) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text('{"key": "0:0", "tokens": [1]}\n{"key": "1:0", "tok')  # killed mid-write
    assert list(read_records(tmp_path)) == ["0:0"]
    with RecordWriter(path) as out:  # the next run cuts the tail before appending
        out.write({"key": "1:0", "tokens": [2]})
    assert [r["key"] for r in read_jsonl(path)] == ["0:0", "1:0"]
    assert "torn" in caplog.text


def test_a_damaged_line_inside_the_file_is_an_error(tmp_path) -> None:
    (tmp_path / "records.jsonl").write_text('{"key": "0:0"}\nnot json\n{"key": "1:0"}\n')
    with pytest.raises(ValueError, match=r"records.jsonl:2 is not a JSON record"):
        read_records(tmp_path)


def test_floats_that_json_cannot_hold_are_refused(tmp_path) -> None:
    with RecordWriter(tmp_path / "records.jsonl") as out, pytest.raises(ValueError):
        out.write({"key": "0:0", "tpot": float("nan")})


def test_ranks_split_the_prompts_and_gather_back(tmp_path) -> None:
    items = list(range(11))
    shards = [Shard(rank, 3) for rank in range(3)]
    parts = [s.select(items) for s in shards]
    assert sorted(sum(parts, [])) == items and max(map(len, parts)) - min(map(len, parts)) <= 1
    for shard, part in zip(shards, parts):
        with RecordWriter(tmp_path / shard.records_name) as out:
            for i in part:
                out.write({"key": f"{i}:0"})
    assert sorted(tmp_path.glob("records*.jsonl")) and len(list(tmp_path.glob("records*.jsonl"))) == 3
    assert sorted(read_records(tmp_path), key=lambda k: int(k.split(":")[0])) == [f"{i}:0" for i in items]


def test_shard_from_the_launchers_environment() -> None:
    assert Shard.from_env({}) == Shard(0, 1, 0)
    shard = Shard.from_env({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"})
    assert (shard.rank, shard.world_size, shard.records_name) == (5, 8, "records.rank5-of-8.jsonl")
    assert shard.device("cuda") == "cuda:1" and shard.device("cpu") == "cpu"
    assert Shard().device("cuda") == "cuda" and Shard().records_name == "records.jsonl"
    with pytest.raises(ValueError, match="RANK < WORLD_SIZE"):
        Shard.from_env({"RANK": "2", "WORLD_SIZE": "2"})


def test_resuming_into_a_directory_of_another_config_is_refused(tmp_path) -> None:
    config = {"temperature": 0.0, "tree": {"budget": 16}}
    check_run_dir(tmp_path, config)  # a fresh directory: fine
    write_json(tmp_path / "run.json", {"config": config})
    check_run_dir(tmp_path, config)  # the same config: resume
    with pytest.raises(RunMismatchError, match=r"tree.budget: 16 -> 32"):
        check_run_dir(tmp_path, {"temperature": 0.0, "tree": {"budget": 32}})
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary behind
