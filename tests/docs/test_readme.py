"""README's first Python example runs as written (it needs no downloads)."""

import re
from pathlib import Path


def test_readme_tiny_example_runs(capsys):
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    exec(compile(blocks[0], "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "ddtree-oracle" in out and "tau=" in out
