"""``AutoMaskCompiler``: the tree block for the targets that read it as it is, a dense mask for the others."""

import torch

from ddtree.drafters import NullDrafter, OracleDrafter
from ddtree.engine import SpeculativeEngine
from ddtree.masks import AutoMaskCompiler, DenseMaskCompiler, TreeMaskCompiler, takes_tree_block
from ddtree.models import HFTarget
from ddtree.models.hybrid_static import StaticHybridTarget
from ddtree.models.static_target import StaticTarget
from ddtree.testing import greedy_reference, tiny_target
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.types import Draft
from ddtree.verifiers import GreedyVerifier


def test_the_fast_targets_get_the_tree_block_and_the_eager_ones_a_dense_mask(tiny_models):
    plain, hybrid = tiny_models["qwen3"], tiny_models["qwen35"]
    static = StaticTarget(plain, max_length=64, cuda_graphs=False)
    assert takes_tree_block(static) and takes_tree_block(StaticHybridTarget(hybrid, max_length=64, cuda_graphs=False))
    assert not takes_tree_block(HFTarget(plain))
    assert type(AutoMaskCompiler().for_target(static)) is TreeMaskCompiler
    assert type(AutoMaskCompiler().for_target(HFTarget(plain))) is DenseMaskCompiler
    # The engine's default, and a given AutoMaskCompiler, become the chosen compiler.
    assert type(SpeculativeEngine(static, NullDrafter(), ChainTreeBuilder()).mask_compiler) is TreeMaskCompiler
    engine = SpeculativeEngine(HFTarget(plain), NullDrafter(), ChainTreeBuilder(), AutoMaskCompiler())
    assert type(engine.mask_compiler) is DenseMaskCompiler


def test_unbound_it_compiles_the_dense_mask():
    q = torch.log_softmax(torch.randn(3, 12, generator=torch.Generator().manual_seed(0)), -1)
    tree = BestFirstTreeBuilder(5).build(Draft(q), root_token=2)
    got = AutoMaskCompiler().to("cpu", torch.float32).compile(tree, past_length=4)
    want = DenseMaskCompiler().compile(tree, past_length=4)
    torch.testing.assert_close(got.attention_mask, want.attention_mask, atol=0, rtol=0)
    assert got.input_ids.tolist() == want.input_ids.tolist() and got.position_ids.tolist() == want.position_ids.tolist()


def test_the_engine_default_on_a_static_target_decodes_the_greedy_tokens():
    """The default mask on the CPU static target (the tree block, written into its own masks) with a
    tree of 6 nodes a round: the target's own greedy tokens."""
    model = tiny_target("qwen3")
    prompt = torch.arange(3, 14)
    target = StaticTarget(model, max_length=128, cuda_graphs=False)
    engine = SpeculativeEngine(target, OracleDrafter(model, depth=4), BestFirstTreeBuilder(6), verifier=GreedyVerifier())
    assert type(engine.mask_compiler) is TreeMaskCompiler
    assert engine.generate(prompt, max_new_tokens=20).tokens == greedy_reference(model, prompt, 20)
