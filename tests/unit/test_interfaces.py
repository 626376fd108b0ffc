"""The ``Target`` Protocol states everything the parts read from a target, and the targets have it."""

import re
from pathlib import Path

import pytest

from ddtree.interfaces import Target
from ddtree.models import HFTarget, HybridTarget
from ddtree.models.static_target import StaticTarget

LIBRARY = Path(__file__).resolve().parents[2] / "ddtree"


def _declared() -> set[str]:
    return set(Target.__annotations__) | {name for name in vars(Target) if not name.startswith("_")}


def test_every_target_attribute_a_drafter_reads_is_declared():
    # ``target.x`` / ``self.target.x`` in the drafters and the test drafters' factories.
    sources = [*sorted((LIBRARY / "drafters").glob("*.py")), LIBRARY / "testing.py"]
    used = {name for path in sources for name in re.findall(r"\btarget\.([A-Za-z_]\w*)", path.read_text())}
    assert used, "no target attribute found: the scan is broken"
    assert used <= _declared(), sorted(used - _declared())


@pytest.mark.parametrize("kind", [HFTarget, StaticTarget, HybridTarget])
def test_the_targets_satisfy_the_protocol(tiny_models, kind):
    model = tiny_models["qwen35" if kind is HybridTarget else "qwen3"]
    target = kind(model, max_length=64)
    assert isinstance(target, Target)
    assert len(target.layers) == target.config.num_hidden_layers
