"""Training features are the decoding side's taps, row for row."""

import torch

from ddtree.models import HFTarget
from ddtree.testing import tiny_target
from ddtree.training.features import freeze, target_features
from ddtree.types import FINAL_NORM


def test_batched_features_equal_the_targets_taps():
    model = tiny_target("qwen3")
    ids = torch.randint(0, 96, (3, 20), generator=torch.Generator().manual_seed(0))
    layers = (1, 2, FINAL_NORM)
    feats = target_features(model, ids, layers)  # [3, 20, 3 * 64]
    assert feats.shape == (3, 20, 3 * 64) and not feats.requires_grad
    target = HFTarget(model)
    target.set_taps(layers)
    for row in range(3):
        torch.testing.assert_close(feats[row], target.prefill(ids[row]).taps, rtol=1e-5, atol=1e-5)


def test_freeze_stops_every_gradient():
    model = freeze(tiny_target("qwen3"))
    assert not model.training and not any(p.requires_grad for p in model.parameters())
