"""The target adapter: tree forward logits and the cache commit are exact."""

import pytest
import torch

from ddtree.masks import DenseMaskCompiler
from ddtree.models import HFTarget
from ddtree.trees import BestFirstTreeBuilder
from ddtree.types import Draft


def _sequential_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def _random_tree(vocab, seed=0, budget=12, depth=4):
    g = torch.Generator().manual_seed(seed)
    draft = Draft(torch.log_softmax(2 * torch.randn(depth, vocab, generator=g), -1))
    return BestFirstTreeBuilder(budget).build(draft, root_token=int(torch.randint(vocab, (1,), generator=g)))


@pytest.mark.parametrize("seed", [0, 1])
def test_tree_logits_equal_each_root_path_run_sequentially(tiny_models, family, seed):
    model = tiny_models[family]
    target = HFTarget(model)
    prompt = torch.randint(0, 90, (9,), generator=torch.Generator().manual_seed(seed))
    target.prefill(prompt)
    tree = _random_tree(target.vocab_size, seed)
    out = target.forward_tree(DenseMaskCompiler().compile(tree, target.past_length))
    for node in range(tree.size):
        path = tree.path_to(node)
        ref = _sequential_logits(model, prompt.tolist() + tree.tokens[path].tolist())[-1]
        torch.testing.assert_close(out.logits[node], ref, atol=1e-4, rtol=1e-4)


def test_commit_equals_the_cache_of_feeding_the_path(tiny_models, family):
    model = tiny_models[family]
    target = HFTarget(model)
    prompt = torch.arange(3, 14)
    target.prefill(prompt)
    tree = _random_tree(target.vocab_size, seed=5, budget=20)
    target.forward_tree(DenseMaskCompiler().compile(tree, target.past_length))
    node = tree.size - 1
    path = tree.path_to(node)
    target.commit(path)
    assert target.past_length == prompt.numel() + len(path)

    reference = HFTarget(model)
    reference.prefill(torch.cat([prompt, tree.tokens[path]]))
    for got, want in zip(target.cache.layers, reference.cache.layers):
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-5)
    assert target.cache.get_seq_length() == reference.cache.get_seq_length()


def test_taps_are_layer_outputs(tiny_models):
    model = tiny_models["qwen3"]
    target = HFTarget(model)
    target.set_taps([0, 2, -1])
    prompt = torch.arange(5, 12)
    out = target.prefill(prompt)
    with torch.no_grad():
        hs = model(prompt[None], output_hidden_states=True).hidden_states
    expected = torch.cat([hs[1][0], hs[3][0], hs[-1][0]], dim=-1)  # hs[-1] is after the final norm
    torch.testing.assert_close(out.taps, expected)


def test_out_of_range_tap_is_a_clear_error(tiny_models):
    with pytest.raises(ValueError, match="hidden tap 9 is out of range"):
        HFTarget(tiny_models["llama"]).set_taps([9])
