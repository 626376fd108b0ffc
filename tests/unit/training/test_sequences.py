"""Regenerated data: the target's own continuations, response masks, file round trip."""

import torch

from ddtree.testing import tiny_target
from ddtree.training.sequences import SequenceSet, prompt_windows, regenerate, response_mask


def test_response_mask_stops_after_the_first_eos():
    ids = torch.tensor([[7, 8, 9, 0, 5, 0], [7, 8, 9, 9, 9, 9]])
    assert response_mask(ids, 2, eos_token_id=0).tolist() == [
        [False, False, True, True, False, False], [False, False, True, True, True, True]]
    assert response_mask(ids, 2, eos_token_id=None)[0].tolist() == [False, False, True, True, True, True]


def test_greedy_regeneration_is_the_targets_greedy_text(tmp_path):
    model = tiny_target("qwen3")
    prompts = prompt_windows(torch.arange(3, 90), count=4, length=5, seed=1)
    assert prompts.shape == (4, 5)
    data = regenerate(model, prompts, new_tokens=12, eos_token_id=None, pad_token_id=0, batch_size=3, log=None)
    assert data.ids.shape == (4, 17) and data.loss_mask[:, 5:].all() and not data.loss_mask[:, :5].any()
    reference = model.generate(prompts[:1], max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(data.ids[0], reference[0])
    data.save(tmp_path / "d.safetensors")
    again = SequenceSet.load(tmp_path / "d.safetensors")
    assert torch.equal(again.ids, data.ids) and torch.equal(again.loss_mask, data.loss_mask)


def test_sampled_regeneration_pads_after_eos():
    model = tiny_target("qwen3")
    prompts = prompt_windows(torch.arange(3, 90), count=8, length=4, seed=2)
    eos = int(model.generate(prompts[:1], max_new_tokens=3, do_sample=False, pad_token_id=0)[0, -1])
    torch.manual_seed(0)
    data = regenerate(model, prompts, new_tokens=10, eos_token_id=eos, pad_token_id=1, temperature=1.0, log=None)
    assert data.ids.shape == (8, 14)
    for row, mask in zip(data.ids, data.loss_mask):
        hits = (row[4:] == eos).nonzero()
        end = 4 + int(hits[0]) + 1 if len(hits) else 14
        assert mask[4:end].all() and not mask[end:].any()
