"""MTP training: the chained layout equals drafting, and the loss falls."""

import pytest
import torch

from ddtree.drafters.mtp import MTPDrafter
from ddtree.models import HFTarget
from ddtree.models.mtp import MTPHead
from ddtree.testing import tiny_target
from ddtree.training.loop import Budget, OptimConfig
from ddtree.training.mtp import MTPTrainConfig, chain_mask, chained_states, mtp_losses, train_mtp
from ddtree.training.sequences import SequenceSet


@pytest.fixture(scope="module")
def model():
    return tiny_target("qwen3")


def test_chain_mask_literal():
    allowed = (chain_mask([4, 3, 2], torch.float32, torch.device("cpu"))[0, 0] == 0).int().tolist()
    # step 3, origins 0 and 1: step-1 rows at origins <= s, then its own chain's steps 2 and 3
    assert allowed == [[1, 0, 0, 0, 1, 0, 0, 1, 0], [1, 1, 0, 0, 0, 1, 0, 0, 1]]


@torch.no_grad()
def test_training_layout_equals_chained_drafting(model):
    head = MTPHead.for_target(model, seed=1)
    target = HFTarget(model)
    drafter = MTPDrafter(head, target, steps=3)
    target.set_taps(drafter.hidden_layers)
    prefix = torch.randint(0, 90, (9,), generator=torch.Generator().manual_seed(4))
    root = 17
    drafter.reset(target.prefill(prefix))
    draft = drafter.draft(root).log_probs  # [3, vocab]; chained steps feed the head's own argmax
    tokens = draft.argmax(-1).tolist()
    ids = torch.tensor([prefix.tolist() + [root] + tokens[:2] + [5, 6]])  # extra tokens after: causal
    states = chained_states(head, model, ids, depth=3)
    assert [s.shape[1] for s in states] == [ids.shape[1] - j for j in (1, 2, 3)]
    origin = len(prefix) - 1  # the pair (h_{N-1}, root)
    for j in range(3):
        got = torch.log_softmax(model.get_output_embeddings()(states[j][0, origin]).float(), -1)
        torch.testing.assert_close(got, draft[j], rtol=1e-4, atol=1e-4)


def test_loss_falls_over_a_few_dozen_steps(model):
    prompts = torch.randint(0, 90, (16, 6), generator=torch.Generator().manual_seed(0))
    ids = model.generate(prompts, max_new_tokens=26, do_sample=False, pad_token_id=0)
    head = MTPHead.for_target(model).float()
    cfg = MTPTrainConfig(batch_size=8, depth=2, log_every=5, optim=OptimConfig(lr=3e-3))
    result = train_mtp(head, model, SequenceSet.from_tokens(ids, 6), cfg, Budget(max_steps=40), log=None)
    assert sum(result.losses[-2:]) / 2 < 0.8 * sum(result.losses[:2]) / 2
    assert not head.training


def test_bf16_autocast_path_runs():
    """The GPU path (float32 head under bf16 autocast, bf16 target) runs; checked on CPU."""
    target16 = tiny_target("qwen3", dtype=torch.bfloat16)
    head = MTPHead.for_target(target16).float()
    data = SequenceSet.from_tokens(torch.randint(0, 90, (2, 12)), 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = mtp_losses(head, target16, data, 3)
    torch.stack(losses).mean().backward()
    assert len(losses) == 3 and all(torch.isfinite(x) for x in losses) and head.fc.weight.grad is not None
