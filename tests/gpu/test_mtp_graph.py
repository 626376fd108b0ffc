"""The graphed MTP drafter on a GPU, in fp32: its drafts equal the eager drafter's round by round,
and every engine decodes the target's own greedy tokens (run with ``pytest -m gpu`` on a machine
with CUDA).

The head is fitted to the target first (``fit_to_target``), so several drafts are accepted per
round and step 1 of the graph reads a varying number of real pairs. One graphed drafter serves
prompts of several lengths in turn (its buffers and graph reused); on the Qwen3 target, one
``StaticTarget`` serves every engine, and the longest prompt crosses its 256-row mask-width bucket
during generation. The drafter itself attends over its whole static cache (it has no buckets), or
with ``attention="flex"`` over the live rows through FlexAttention block tables.
"""

import pytest
import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import MTPDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import HybridTarget, MTPHead
from ddtree.models.mtp import fit_to_target
from ddtree.models.static_target import StaticTarget
from ddtree.testing import LockstepDrafter, greedy_reference, tiny_hybrid_target, tiny_target
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

VOCAB, NEW, MAX_LENGTH = 128, 64, 512
LENGTHS = (1, 5, 13, 29, 200)  # 200 + 64 crosses StaticTarget's 256-row bucket
TARGETS = {"qwen3": lambda: tiny_target("qwen3", vocab_size=VOCAB), "qwen3_5": lambda: tiny_hybrid_target(vocab_size=VOCAB)}


@pytest.fixture(scope="module", params=sorted(TARGETS))
def setup(request):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = TARGETS[request.param]().cuda()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(6, VOCAB - 8, (n,), generator=gen).cuda() for n in LENGTHS]
    refs = [greedy_reference(model, p, NEW) for p in prompts]
    head = MTPHead.for_target(model)  # on the model's device
    texts = [torch.cat([p, torch.tensor(r, device=p.device)]) for p, r in zip(prompts, refs)]
    fit_to_target(head, model, texts, steps=150, depth=3, lr=1e-2, temperature=0.25)
    target = StaticTarget(model, max_length=MAX_LENGTH) if request.param == "qwen3" else HybridTarget(model)
    return request.param, model, target, head, prompts, refs


@pytest.mark.parametrize("steps,tree,top_k,attention", [(1, "chain", None, "auto"), (2, "chain", None, "auto"),
                                                       (3, "chain", None, "auto"), (3, 8, 2, "auto"),
                                                       (1, "chain", None, "flex"), (3, "chain", None, "flex")],
                         ids=["mtp1", "mtp2", "mtp3", "mtp3-tree8-top2", "mtp1-flex", "mtp3-flex"])
def test_graphed_drafts_equal_eager_and_decode_greedy(setup, steps, tree, top_k, attention):
    """``attention="auto"`` keeps the dense mask over this 512-row cache; "flex" reads the live rows
    through one ``FlexLayout`` per forward of the chain, P rewritten inside the graph."""
    family, model, target, head, prompts, refs = setup
    graphed = MTPDrafter(head, target, steps=steps, top_k=top_k, max_length=MAX_LENGTH, cuda_graphs=True,
                         attention=attention)
    assert graphed.cuda_graphs and graphed._chain.attention == ("flex" if attention == "flex" else "dense")
    twin = LockstepDrafter(graphed, MTPDrafter(head, target, steps=steps, top_k=top_k))
    builder = ChainTreeBuilder() if tree == "chain" else BestFirstTreeBuilder(tree)
    engine = SpeculativeEngine(target, twin, builder, DenseMaskCompiler(), GreedyVerifier())
    rounds, accepted = 0, 0
    for prompt, ref in [*zip(prompts, refs), (prompts[1], refs[1])]:  # a short prompt again after the long one
        result = engine.generate(prompt, max_new_tokens=NEW)
        assert result.tokens == ref, f"{family} k={steps}, prompt of {prompt.numel()} tokens: parts at " \
            f"{next(i for i, (a, b) in enumerate(zip(result.tokens, ref)) if a != b)}"
        rounds += len(result.acceptance_lengths)
        accepted += sum(result.acceptance_lengths)
    assert twin.rounds == rounds  # every draft compared
    if steps > 1:
        assert accepted / rounds > 1.3, f"{family} k={steps}: tau {accepted / rounds:.2f}, too few acceptances"


def test_auto_graphs_on_the_gpu_and_a_full_cache_is_an_error(setup):
    family, model, target, head, prompts, refs = setup
    assert MTPDrafter(head, target, steps=3, cuda_graphs="auto").cuda_graphs
    drafter = MTPDrafter(head, target, steps=3, max_length=16, cuda_graphs=True)
    engine = SpeculativeEngine(target, drafter, ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier())
    with pytest.raises(ValueError, match="cache of 16 rows is full"):
        engine.generate(prompts[2], max_new_tokens=NEW)
