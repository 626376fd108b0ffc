"""DFlash training: anchors, the block layout and mask, equality with drafting, a falling loss."""

import math

import pytest
import torch

from ddtree.drafters import DFlashDrafter
from ddtree.models import HFTarget
from ddtree.testing import tiny_target
from ddtree.training.dflash import (
    DFlashTrainConfig,
    dflash_forward,
    feature_cache,
    grow_dflash,
    layout_blocks,
    loss_weights,
    new_dflash,
    sample_anchors,
    tap_layers,
    train_dflash,
    weighted_loss,
)
from ddtree.training.loop import Budget, OptimConfig
from ddtree.training.sequences import SequenceSet


@pytest.fixture(scope="module")
def model():
    return tiny_target("qwen3")


def test_loss_weights_follow_the_paper():
    w = loss_weights(16, 7.0)
    assert w[0] == 0 and w[1] == 1 and w.shape == (16,)
    assert w[15].item() == pytest.approx(math.exp(-14 / 7))
    assert tap_layers(36, 5) == (1, 9, 17, 25, 33)


def test_anchors_are_response_tokens_with_a_label_after_them():
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0, 4:10] = True  # positions 4..9 are the response; anchors may be 4..8
    mask[1, 10:] = True  # one candidate: 10
    anchors, real = sample_anchors(mask, 3, torch.Generator().manual_seed(0))
    assert anchors.shape == (2, 3) and real[0].all() and real[1].tolist().count(True) == 1
    assert all(4 <= a <= 8 for a in anchors[0].tolist()) and anchors[0].tolist() == sorted(anchors[0].tolist())
    assert anchors[1][real[1]].tolist() == [10]


def test_layout_mask_labels_and_weights_literal():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    mask = torch.tensor([[False, False, True, True, True, True]])
    blocks = layout_blocks(SequenceSet(ids, mask), torch.tensor([[2, 4]]), torch.tensor([[True, True]]),
                           block_size=3, mask_token_id=99, gamma=1.0)
    assert blocks.ids.tolist() == [[12, 99, 99, 14, 99, 99]]
    assert blocks.positions.tolist() == [[2, 3, 4, 4, 5, 6]]
    assert blocks.labels.tolist() == [12, 13, 14, 14, 15, 15]  # the last label is past the end: weight 0
    assert [round(w, 3) for w in blocks.weights.tolist()] == [0.0, 1.0, 0.368, 0.0, 1.0, 0.0]
    # Columns: the sequence's 6 context features, then its 6 block rows. Context strictly before the anchor.
    assert blocks.mask.int().tolist() == [[
        [1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1],
    ]]


def test_each_sequence_attends_over_its_own_batch_entry():
    ids = torch.arange(16).view(2, 8)
    blocks = layout_blocks(SequenceSet(ids, torch.ones(2, 8, dtype=torch.bool)), torch.tensor([[3], [5]]),
                           torch.ones(2, 1, dtype=torch.bool), block_size=2, mask_token_id=0, gamma=1.0)
    assert blocks.mask.shape == (2, 2, 8 + 2) and blocks.ids.tolist() == [[3, 0], [13, 0]]
    ctx = blocks.mask[..., :8]
    assert ctx[0, :, :3].all() and not ctx[0, :, 3:].any()  # sequence 0, anchor 3: its features 0..2
    assert ctx[1, :, :5].all() and not ctx[1, :, 5:].any()  # sequence 1, anchor 5: its features 0..4
    assert blocks.labels.tolist() == [3, 4, 13, 14]


def test_training_forward_equals_drafting_for_every_block(model):
    """The concatenated, masked training pass gives each block exactly the drafter's own distributions."""
    drafter = new_dflash(model, mask_token_id=95, block_size=6, num_layers=2, num_taps=2, seed=1)
    ids = torch.randint(0, 90, (2, 24), generator=torch.Generator().manual_seed(3))
    data = SequenceSet.from_tokens(ids, prompt_length=4)
    anchors = torch.tensor([[5, 11, 17], [4, 9, 20]])
    blocks = layout_blocks(data, anchors, torch.ones(2, 3, dtype=torch.bool), 6, 95, 7.0)
    with torch.no_grad():
        logits = dflash_forward(drafter, model, data, blocks).view(2, 3, 6, -1)
    target = HFTarget(model)
    decoding = DFlashDrafter(drafter, target)
    target.set_taps(decoding.hidden_layers)
    for b in range(2):
        for j, a in enumerate(anchors[b].tolist()):
            decoding.reset(target.prefill(ids[b, :a]))
            expected = decoding.draft(int(ids[b, a])).log_probs  # [5, vocab]
            got = torch.log_softmax(logits[b, j, 1:].float(), dim=-1)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_loss_falls_and_only_drafter_weights_move(model):
    prompts = torch.randint(0, 90, (16, 6), generator=torch.Generator().manual_seed(0))
    ids = model.generate(prompts, max_new_tokens=26, do_sample=False, pad_token_id=0)
    data = SequenceSet.from_tokens(ids, prompt_length=6)
    drafter = new_dflash(model, mask_token_id=95, block_size=8, num_layers=1, num_taps=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = DFlashTrainConfig(batch_size=4, anchors=6, log_every=10, optim=OptimConfig(lr=3e-3))
    result = train_dflash(drafter, model, data, cfg, Budget(max_steps=40), log=None)
    first, last = sum(result.losses[:2]) / 2, sum(result.losses[-2:]) / 2
    assert last < 0.8 * first
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_feature_cache_trains_exactly_as_features_per_step(model):
    """Caching the target's features up front changes nothing but the time a step takes."""
    prompts = torch.randint(0, 90, (8, 6), generator=torch.Generator().manual_seed(1))
    data = SequenceSet.from_tokens(model.generate(prompts, max_new_tokens=18, do_sample=False, pad_token_id=0), 6)
    losses = []
    for gib in (0.0, 1.0):
        drafter = new_dflash(model, mask_token_id=95, block_size=4, num_layers=1, num_taps=2, seed=2)
        cfg = DFlashTrainConfig(batch_size=4, anchors=3, log_every=1, feature_cache_gib=gib, optim=OptimConfig(lr=3e-3))
        losses.append(train_dflash(drafter, model, data, cfg, Budget(max_steps=6), log=None).losses)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    assert feature_cache(model, data, (1,), max_gib=1e-9) is None  # too big for the cap: per step
    assert feature_cache(model, data, (1,), max_gib=0.0) is None


def test_bf16_autocast_path_runs(model):
    """The GPU path (bf16 autocast over a bf16 target) has no dtype mismatch; checked on CPU."""
    target16 = tiny_target("qwen3", dtype=torch.bfloat16)
    drafter = new_dflash(target16, mask_token_id=95, block_size=4, num_layers=1, num_taps=2).float()
    data = SequenceSet.from_tokens(torch.randint(0, 90, (2, 12)), prompt_length=3)
    blocks = layout_blocks(data, *sample_anchors(data.loss_mask, 2, torch.Generator().manual_seed(0)), 4, 95, 2.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = dflash_forward(drafter, target16, data, blocks)
    assert logits.shape == (16, 96) and torch.isfinite(logits.float()).all()
    logits.float().sum().backward()
    assert drafter.fc.weight.grad is not None


def test_a_grown_drafter_computes_what_it_did_and_then_trains_its_new_parts(model):
    """More layers and taps, same logits: new fc columns and new layers' output projections start at zero."""
    drafter = new_dflash(model, mask_token_id=95, block_size=6, num_layers=1, num_taps=1, seed=1)
    with torch.no_grad():  # a trained drafter's layers are not near identity: make them count
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids = torch.randint(0, 90, (2, 24), generator=torch.Generator().manual_seed(3))
    data = SequenceSet.from_tokens(ids, prompt_length=4)
    blocks = layout_blocks(data, torch.tensor([[5, 11], [4, 9]]), torch.ones(2, 2, dtype=torch.bool), 6, 95, 7.0)
    grown = grow_dflash(drafter, 3, (0, 1, 2))
    assert grown.config.num_hidden_layers == 3 and grown.config.target_layer_ids == (0, 1, 2)
    with torch.no_grad():
        torch.testing.assert_close(dflash_forward(grown, model, data, blocks), dflash_forward(drafter, model, data, blocks))
    loss = weighted_loss(dflash_forward(grown, model, data, blocks), blocks)
    loss.backward()
    assert grown.layers[2].self_attn.o_proj.weight.grad.abs().sum() > 0  # the new layer learns
    assert grown.fc.weight.grad[:, 2 * 64 :].abs().sum() > 0  # so do the new taps' columns
    with pytest.raises(ValueError, match="cannot become 1 layers and taps \\[0\\]"):
        grow_dflash(grown, 1, (0,))
