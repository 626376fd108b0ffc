"""Weights load without unpickling anywhere in the repository: no pickle, no ``torch.load``
without ``weights_only=True``, no remote code, and every Transformers model ``from_pretrained``
passes ``use_safetensors=True`` (the library's own loaders read safetensors only)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for folder in ("ddtree", "experiments", "tests", "notebooks", "docs")
                 for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".ipynb", ".sh"))
SELF = Path(__file__).resolve()
MODEL_LOAD = re.compile(r"\b(?:AutoModel\w*|\w+For\w+)\.from_pretrained\(")


def _call(text: str, start: int) -> str:
    """The text of the call whose opening parenthesis ends the match at ``start``."""
    depth, i = 1, start
    while depth and i < len(text):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    return text[start:i]


def _where(path: Path, text: str, at: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, at) + 1}"


def test_no_unsafe_loading_anywhere():
    bad = []
    for path in SOURCES:
        if path == SELF:
            continue
        text = path.read_text(encoding="utf-8")
        bad += [f"{_where(path, text, m.start())}: {m.group(0)}"
                for m in re.finditer(r"\bpickle\b|trust_remote_code", text)]
        bad += [f"{_where(path, text, m.start())}: torch.load without weights_only=True"
                for m in re.finditer(r"\btorch\.load\(", text) if "weights_only=True" not in _call(text, m.end())]
        bad += [f"{_where(path, text, m.start())}: {m.group(0)} without use_safetensors=True"
                for m in MODEL_LOAD.finditer(text) if "use_safetensors=True" not in _call(text, m.end())]
    assert len(SOURCES) > 50 and not bad, "\n".join(bad)
