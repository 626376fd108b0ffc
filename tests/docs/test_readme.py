"""README's Python examples that need no downloads run as written: the first (ddtree.load on the
shipped pair) and the parts-level one on tiny random-weight models."""

import re
from pathlib import Path


def _blocks() -> list[str]:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_first_example_decodes_with_ddtree_in_three_lines(capsys):
    first = _blocks()[0]
    body = [line for line in first.splitlines() if line.strip() and not line.startswith(("import", "from"))]
    assert len(body) <= 3 and "ddtree.load(" in first
    exec(compile(first, "README.md", "exec"), {})
    out = capsys.readouterr().out
    tau = float(re.search(r"tau=([0-9.]+)", out).group(1))
    assert tau > 1.5  # the shipped drafter accepts several tokens per round


def test_readme_parts_example_runs(capsys):
    exec(compile(_blocks()[1], "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "ddtree-oracle" in out and "tau=" in out
