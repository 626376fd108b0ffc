"""The kernel forms the GPU benches found fastest, as speed.py overrides (``gpu_tables.sh``'s ``FORMS``).

    OUT=dir bash experiments/gpu_tables.sh gdn-push prefix-forms 27b-8192-forms     # the benches, the defaults
    FORMS="$(python experiments/pick_forms.py dir)" OUT=dir/on bash experiments/gpu_tables.sh 27b-8192-forms

Reads ``prefix-forms.json`` (``prefix_tiles_bench.py``) and ``gdn-push.json`` (``gdn_kernel_bench.py``)
from the folder and prints, on one line:

- ``prefix_tile_256=[...]`` and ``split_block=true|false``: the Triton prefix form (tile, with or without
  the block in its launch) with the least summed time over the verify sizes 16, 65 and 257 at P = 8192,
  at the segment count the library runs (``S0``), among forms within the reference tolerance at all
  three; nothing where no form was timed at all three;
- ``gdn_push=true|false``: whether the push rule was faster than the split one at every timed size up to
  128 nodes (tf32, the best block of each); nothing where neither was timed.

What it chose and why goes to stderr. Plain argparse; no GPU needed.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

from ddtree.errors import run_cli

SIZES = (16, 65, 257)
TOLERANCE = 0.05  # split_attention.SERVES_TOLERANCE


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="where gpu_tables.sh wrote prefix-forms.json and gdn-push.json")
    p.add_argument("--past", type=int, default=8192, help="the committed length whose rows decide")
    return p.parse_args(argv)


def prefix_choice(rows: list[dict], past: int) -> tuple[tuple[int, ...], bool] | None:
    """(tile, block in the launch) with the least summed time over ``SIZES`` at ``past``, or None.

    >>> rows = [{"P": 8192, "n": n, "S0": 4, "(64, 32, 4, 2)/S4": [10.0, 0.001], "(64, 32, 4, 2)/S4/fused": [8.0, 0.001],
    ...          "(64, 32, 4, 2)/S9": [1.0, 0.001], "(128, 32, 8, 2, 128)/S4": "OutOfResources: ..."} for n in SIZES]
    >>> prefix_choice(rows, 8192)
    ((64, 32, 4, 2), True)
    """
    rows = [r for r in rows if r.get("P") == past and r.get("n") in SIZES]
    totals: dict[tuple[str, bool], dict[int, float]] = {}
    for row in rows:
        for key, value in row.items():
            if not isinstance(value, list) or "/S" not in key:
                continue
            tile, rest = key.split("/S", 1)
            segments, _, fused = rest.partition("/")
            if int(segments) == row["S0"] and value[1] < TOLERANCE:
                totals.setdefault((tile, fused == "fused"), {})[row["n"]] = value[0]
    whole = {form: sum(times.values()) for form, times in totals.items() if set(times) == set(SIZES)}
    if not whole:
        return None
    for form, total in sorted(whole.items(), key=lambda item: item[1])[:5]:
        print(f"prefix {form[0]}{' with the block' if form[1] else ''}: {total:.1f} us over n = {SIZES}",
              file=sys.stderr)
    tile, fused = min(whole, key=whole.get)
    return tuple(ast.literal_eval(tile)), fused


def push_choice(rows: list[dict]) -> bool | None:
    """Whether push beat split (tf32, best block each) at every size up to 128 nodes where both ran.

    >>> push_choice([{"n": 65, "rule/bt16/bv32/tf32/split": {"us": 26.0}, "rule/bt16/bv32/tf32/push": {"us": 12.0},
    ...               "rule/bt32/bv32/tf32/push": {"error": "..."}}, {"n": 257, "rule/bt32/bv32/tf32/split": {"us": 9.0}}])
    True
    """
    wins = []
    for row in rows:
        best = {form: min((v["us"] for k, v in row.items() if k.endswith(f"/tf32/{form}") and "us" in v), default=None)
                for form in ("split", "push")}
        if row.get("n", 0) <= 128 and None not in best.values():
            print(f"gdn rule at {row['n']} nodes: split {best['split']:.1f} us, push {best['push']:.1f}", file=sys.stderr)
            wins.append(best["push"] < best["split"])
    return all(wins) if wins else None


def main(argv=None) -> None:
    args = parse_args(argv)
    words = []
    prefix_file, gdn_file = args.folder / "prefix-forms.json", args.folder / "gdn-push.json"
    if prefix_file.is_file():
        chosen = prefix_choice(json.loads(prefix_file.read_text()), args.past)
        if chosen is not None:
            words += [f"prefix_tile_256=[{','.join(map(str, chosen[0]))}]", f"split_block={str(chosen[1]).lower()}"]
    if gdn_file.is_file():
        push = push_choice(json.loads(gdn_file.read_text())["rows"])
        if push is not None:
            words.append(f"gdn_push={str(push).lower()}")
    if not words:
        raise ValueError(f"{args.folder}: no prefix-forms.json or gdn-push.json with timed forms to choose from "
                         "(run gpu_tables.sh's gdn-push and prefix-forms steps into it first)")
    print(" ".join(words))


if __name__ == "__main__":
    run_cli(main)
