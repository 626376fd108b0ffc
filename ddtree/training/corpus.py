"""A reproducible code corpus: the Python standard library's own source, with held-out modules.

The file list is a pure function of the ``Lib/`` tree: every ``*.py`` file in sorted relative
path order, minus tests, site-packages and generated data tables. A module is held out when
the SHA-256 of its dotted name falls in a fixed 5 % bucket, so the split needs no list to be
kept in sync and does not move when files are added elsewhere.

    >>> docs = read_corpus(".corpus/stdlib.jsonl")             # doctest: +SKIP
    >>> train = [d.text for d in docs if d.split == "train"]   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import platform
import random
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

# Test suites duplicate the code they test; encodings/ and pydoc_data/ are generated tables
# and prose, not code a model should learn to continue.
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__", "lib-dynload",
                           "encodings", "pydoc_data"})
HELDOUT_PERCENT = 5


@dataclass(frozen=True)
class Document:
    """One source file of the corpus."""

    path: str  # relative to Lib/, POSIX separators
    module: str  # dotted module name ("json.decoder", "json" for json/__init__.py)
    split: str  # "train" or "heldout"
    text: str


def module_name(path: str) -> str:
    """``"json/decoder.py"`` -> ``"json.decoder"``; a package's ``__init__`` is the package.

    >>> module_name("json/__init__.py"), module_name("os.py")
    ('json', 'os')
    """
    parts = path[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def is_heldout(module: str, percent: int = HELDOUT_PERCENT) -> bool:
    """The fixed held-out bucket: the first 8 bytes of sha256(module) mod 100 < percent.

    >>> is_heldout("json.decoder") in (True, False)
    True
    """
    digest = hashlib.sha256(module.encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < percent


def stdlib_root() -> Path:
    """This interpreter's ``Lib/`` directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list[Path]:
    """The corpus file list: sorted, deterministic, ``*.py`` outside ``EXCLUDED_DIRS``."""
    files = []
    for file in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = file.relative_to(root)
        if any(part in EXCLUDED_DIRS or part.startswith("config-") for part in rel.parts[:-1]):
            continue
        if file.name.startswith("_sysconfigdata"):  # build-specific, differs between machines
            continue
        files.append(file)
    return files


def build_corpus(root: Path | None = None, percent: int = HELDOUT_PERCENT) -> list[Document]:
    """Read every corpus file of ``root`` (default: this interpreter's stdlib)."""
    root = Path(root) if root is not None else stdlib_root()
    docs = []
    for file in source_files(root):
        try:
            text = file.read_bytes().decode("utf-8")
        except UnicodeDecodeError:  # none in CPython 3.11; skipped rather than guessed at
            continue
        rel = file.relative_to(root).as_posix()
        module = module_name(rel)
        docs.append(Document(rel, module, "heldout" if is_heldout(module, percent) else "train", text))
    return docs


def meta_path(path: str | Path) -> Path:
    """The corpus's sidecar record (source interpreter, counts, checksum)."""
    return Path(path).with_suffix(".meta.json")


def write_corpus(docs: Sequence[Document], path: str | Path, source: str | None = None) -> Path:
    """Write ``docs`` as JSONL, and a ``.meta.json`` beside it (``source`` defaults to this CPython)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(asdict(doc), ensure_ascii=False) + "\n")
    meta = {
        "source": source or f"CPython {platform.python_version()} Lib/",
        "files": len(docs),
        "heldout_files": sum(d.split == "heldout" for d in docs),
        "heldout_percent": HELDOUT_PERCENT,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    meta_path(path).write_text(json.dumps(meta, indent=2) + "\n")
    return path


def read_corpus(path: str | Path) -> list[Document]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"corpus file {path} not found: build it on a CPU machine with "
            "`python experiments/build_corpus.py` and carry .corpus/ to this machine"
        )
    with path.open(encoding="utf-8") as f:
        return [Document(**json.loads(line)) for line in f if line.strip()]


def split_texts(docs: Sequence[Document], split: str) -> list[str]:
    return [d.text for d in docs if d.split == split]


def code_prefixes(docs: Sequence[Document], count: int, lines: int = 24, seed: int = 0) -> list[dict]:
    """Prompts cut from ``docs``: ``lines`` whole source lines starting at a top-level ``def`` or
    ``class`` picked at random (seeded), so a prompt opens where code is worth continuing.

    >>> code_prefixes([Document("a.py", "a", "heldout", "x = 1\\ndef f():\\n    return 2\\n")], 1, lines=2)
    [{'id': 'a.py:2', 'text': 'def f():\\n    return 2\\n'}]
    """
    rng = random.Random(seed)
    starts = [(d, i) for d in docs for i, line in enumerate(d.text.splitlines(keepends=True))
              if line.startswith(("def ", "class "))]
    rng.shuffle(starts)
    prompts, seen = [], set()
    for doc, line in starts:
        if doc.path in seen:  # one prompt per file, so the prompts cover more modules
            continue
        seen.add(doc.path)
        text = "".join(doc.text.splitlines(keepends=True)[line : line + lines])
        prompts.append({"id": f"{doc.path}:{line + 1}", "text": text})
        if len(prompts) == count:
            break
    return prompts


def docstring_ends(docs: Sequence[Document], count: int, seed: int = 0, tail_chars: int = 4000) -> list[str]:
    """Up to ``count`` texts, each the last ``tail_chars`` characters of a document's source up to
    the end of one function's docstring (the closing quotes and the newline), picked at random
    (seeded): the place where a signature and its documentation ask for the body, as in
    HumanEval's prompts.

    >>> docstring_ends([Document("a.py", "a", "train", "x = 1\\ndef f():\\n    'Two.'\\n    return 2\\n")], 1)
    ["x = 1\\ndef f():\\n    'Two.'\\n"]
    """
    import ast

    ends = []
    for doc in docs:
        try:
            tree = ast.parse(doc.text)
        except (SyntaxError, ValueError):
            continue
        lines = None
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node) is not None:
                lines = lines or doc.text.splitlines(keepends=True)
                ends.append((doc, lines, node.body[0].end_lineno))
    rng = random.Random(seed)
    rng.shuffle(ends)
    return ["".join(lines[max(0, end - 200) : end])[-tail_chars:] for _, lines, end in ends[:count]]
