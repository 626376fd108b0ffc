"""ddtree.training holds training only: none of its modules imports the decoding side's parts."""

import ast
from pathlib import Path

TRAINING = Path(__file__).resolve().parents[3] / "ddtree" / "training"
# The decoding loop and its parts, and what measures them; models/ (checkpoint formats) is shared.
FORBIDDEN = ("ddtree.engine", "ddtree.drafters", "ddtree.trees", "ddtree.masks", "ddtree.verifiers",
             "ddtree.eval", "ddtree.presets")


def imported(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names, inside functions too (``from ddtree
    import engine`` counts as ``ddtree.engine``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_training_imports_no_decoding_part():
    offenders = {f"{path.name}: {name}" for path in sorted(TRAINING.rglob("*.py")) for name in imported(path)
                 if name == "ddtree.SpeculativeEngine" or any(name == f or name.startswith(f + ".") for f in FORBIDDEN)}
    assert not offenders, sorted(offenders)


def test_the_check_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from ddtree import engine\n    import ddtree.trees.chain as chain\n")
    assert {"ddtree.engine", "ddtree.trees.chain"} <= imported(source)
