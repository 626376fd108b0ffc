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


@pytest.mark.parametrize("kind", [HFTarget, StaticTarget, HybridTarget])
def test_every_target_hands_prompt_taps_to_a_sink(tiny_models, kind):
    """``prefill(ids, taps_sink=f)``: every prompt row's taps reach ``f`` in order, none come back."""
    import torch

    model = tiny_models["qwen35" if kind is HybridTarget else "qwen3"]
    target = kind(model, max_length=64)
    target.set_taps((0, 1))
    ids = torch.arange(3, 20)
    whole = target.prefill(ids).taps
    chunks = []
    out = target.prefill(ids, taps_sink=chunks.append)
    assert out.taps is None and out.logits.shape[0] == 1
    torch.testing.assert_close(torch.cat(chunks), whole)


def test_the_engine_streams_only_where_both_parts_can():
    """A target whose prefill takes no ``taps_sink``, or a drafter without ``prompt_sink``, keeps the
    plain prefill (both are optional parts of the protocols)."""
    from ddtree.engine import _prompt_sink

    class Plain:
        def prefill(self, input_ids):
            return None

    class Streaming:
        def prefill(self, input_ids, taps_sink=None):
            return None

    class Sinking:
        def prompt_sink(self):
            return print

    assert _prompt_sink(Plain(), Sinking()) is None
    assert _prompt_sink(Streaming(), object()) is None
    assert _prompt_sink(Streaming(), Sinking()) is print
