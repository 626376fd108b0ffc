"""Every Python snippet and shell command of README.md runs as written.

README's fenced ``python`` blocks are executed; its ``bash`` blocks are run line by line, each
``python experiments/X.py ARGS`` command in this process (the ``cli`` fixture) from one scratch
folder per block, so that a block's later commands read what its earlier ones wrote. A block
that cannot run here says so right above it, visibly: ``<!-- not run in CI: why -->`` (a GPU,
a download, the test suite itself), and that list stays short.

The commands run as README gives them, with two documented changes: ``CHEAP`` appends
overrides that shrink a run (fewer prompts and tokens, one thread, the main job on the Qwen3 pair
unless the command is about the hybrid one; Hydra takes the last value of a knob) so that the whole file runs in about a minute on a CPU, and ``PLACEHOLDERS`` stand for
paths a reader fills in.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"(?:<!-- not run in CI: (?P<why>[^>]*?) -->\n)?```(?P<lang>python|bash)\n(?P<code>.*?)```", re.S)

# Per entry point: overrides appended to each README command (the knobs it sets itself stay,
# apart from these), keeping its work to one or two prompts and a few tokens.
CHEAP = {
    "main.py": ["prompt_sets.humaneval.limit=1", "prompt_sets.heldout.limit=1", "max_prompt_tokens=32",
                "max_new_tokens=8", "temperatures=[0]", "warmup_tokens=0", "progress=false",
                "threads=1", "~pairs.pair_hybrid"],  # the suite's one thread: two spin-wait beside other processes
    "run.py": ["data.limit=1", "max_new_tokens=8", "warmup_tokens=0", "progress=false"],
    "make_tables.py": ["--no-plots"],
}
PLACEHOLDERS = {"/path/to/pair": str(ROOT / "assets" / "pair")}


def cheap(script: str, argv: list[str]) -> list[str]:
    """``CHEAP[script]`` less what the command itself removes or chooses: a deleted prompt set is not
    shrunk, and a command about the hybrid pair keeps it (the others run the Qwen3 pair alone)."""
    removed = {a.lstrip("~").split("=")[0] for a in argv if a.startswith("~")}
    hybrid = any("pair_hybrid" in a or a == "~pairs.pair" for a in argv)
    return [o for o in CHEAP.get(script, []) if o.split("=")[0].rsplit(".", 1)[0] not in removed
            and not (hybrid and o == "~pairs.pair_hybrid")]


def blocks(lang: str) -> list[tuple[str, str | None]]:
    """(code, why it is not run or None) of every ``lang`` block, in README order."""
    return [(m["code"], m["why"]) for m in FENCE.finditer(README) if m["lang"] == lang]


def commands(code: str) -> list[list[str]]:
    """A bash block's commands, continuation lines joined, comments dropped, split as the shell would."""
    return [shlex.split(line, comments=True) for line in code.replace("\\\n", " ").splitlines()
            if shlex.split(line, comments=True)]


def _label(code: str) -> str:
    return code.strip().splitlines()[0][:60]


def test_readme_first_example_decodes_with_ddtree_in_three_lines(capsys):
    first = blocks("python")[0][0]
    body = [line for line in first.splitlines() if line.strip() and not line.startswith(("import", "from"))]
    assert len(body) <= 3 and "ddtree.load(" in first
    exec(compile(first, "README.md", "exec"), {})
    tau = float(re.search(r"tau=([0-9.]+)", capsys.readouterr().out).group(1))
    assert tau > 1.5  # the shipped drafter accepts several tokens per round


def test_only_a_few_blocks_are_not_run_and_each_says_why():
    skipped = [why for lang in ("python", "bash") for _, why in blocks(lang) if why is not None]
    assert len(skipped) <= 6 and all(why.strip() for why in skipped), skipped
    assert len(blocks("python")) >= 4 and len(blocks("bash")) >= 4


@pytest.mark.parametrize("code", [c for c, why in blocks("python")[1:] if why is None], ids=_label)
def test_readme_python_block_runs(code, capsys):
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.strip()  # every example prints what it shows
    for tau in re.findall(r"tau=([0-9.]+)", out):
        assert float(tau) >= 1.0


@pytest.mark.parametrize("code", [c for c, why in blocks("bash") if why is None], ids=_label)
def test_readme_bash_block_runs(code, cli, tmp_path):
    (tmp_path / "my_prompts.jsonl").write_text(json.dumps({"prompt": "def add(a, b):\n"}) + "\n")
    for argv in commands(code):
        for placeholder, value in PLACEHOLDERS.items():
            argv = [arg.replace(placeholder, value) for arg in argv]
        assert argv[0] == "python" and argv[1].startswith("experiments/"), \
            f"README command {shlex.join(argv)} cannot run in CI: mark its block <!-- not run in CI: why -->"
        script = Path(argv[1]).name
        out = cli(script, *argv[2:], *cheap(script, argv[2:]), cwd=tmp_path)
        assert out.returncode == 0, f"{shlex.join(argv)}\n{out.stderr[-3000:]}"
