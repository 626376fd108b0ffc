"""The stdlib corpus: a deterministic file list, a fixed held-out bucket, a JSONL round trip."""

import json

from ddtree.training.corpus import (
    Document,
    build_corpus,
    code_prefixes,
    is_heldout,
    meta_path,
    module_name,
    read_corpus,
    source_files,
    write_corpus,
)


def _fake_lib(root):
    files = {
        "os.py": "import sys\n", "json/__init__.py": "from .decoder import *\n", "json/decoder.py": "def f():\n    pass\n",
        "json/tests/test_x.py": "x", "test/test_os.py": "x", "site-packages/pkg/a.py": "x",
        "encodings/cp1252.py": "x", "_sysconfigdata__linux.py": "x", "idlelib/idle_test/t.py": "x", "notes.txt": "x",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_file_list_is_sorted_and_excludes_tests_and_tables(tmp_path):
    lib = _fake_lib(tmp_path / "Lib")
    rel = [f.relative_to(lib).as_posix() for f in source_files(lib)]
    assert rel == ["json/__init__.py", "json/decoder.py", "os.py"]


def test_module_names_and_the_heldout_bucket_are_fixed():
    assert module_name("json/__init__.py") == "json" and module_name("json/decoder.py") == "json.decoder"
    assert module_name("os.py") == "os"
    names = [f"mod{i}" for i in range(2000)]
    share = sum(map(is_heldout, names)) / len(names)
    assert 0.03 < share < 0.07  # a 5 % bucket
    assert [is_heldout(n) for n in names[:50]] == [is_heldout(n) for n in names[:50]]
    # Pinned: the split of the shipped corpus must not move between releases.
    assert is_heldout("secrets") and is_heldout("plistlib") and not is_heldout("os") and not is_heldout("json")


def test_corpus_round_trips_through_jsonl_with_meta(tmp_path):
    docs = build_corpus(_fake_lib(tmp_path / "Lib"), percent=50)
    assert {d.split for d in docs} <= {"train", "heldout"}
    path = write_corpus(docs, tmp_path / "c" / "corpus.jsonl", source="test")
    assert read_corpus(path) == docs
    meta = json.loads(meta_path(path).read_text())
    assert meta["files"] == 3 and meta["source"] == "test" and len(meta["sha256"]) == 64


def test_code_prefixes_start_at_definitions_one_per_file():
    docs = [Document("a.py", "a", "heldout", "x = 1\ndef f():\n    return 1\ndef g():\n    pass\n"),
            Document("b.py", "b", "heldout", "class C:\n    pass\n")]
    prompts = code_prefixes(docs, count=5, lines=2, seed=0)
    assert len(prompts) == 2 and {p["id"].split(":")[0] for p in prompts} == {"a.py", "b.py"}
    assert all(p["text"].startswith(("def ", "class ")) for p in prompts)
    assert prompts == code_prefixes(docs, count=5, lines=2, seed=0)
