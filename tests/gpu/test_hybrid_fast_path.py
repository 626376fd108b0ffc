"""The hybrid fast path on a GPU, in fp32: ``StaticHybridTarget`` with CUDA graphs gives the target's
own greedy tokens for every strategy, budget order and engine reuse (run with ``pytest -m gpu``).

Same design as test_fast_path_exact: one target serves every engine of a sequence, prompts include
one as long as a verify and one crossing a mask-width bucket, budget sequences revisit sizes. And the
GDN tree math as captured (fp32 on the GPU) against the token-by-token recurrence in fp64.
"""

import copy
import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree.models.gdn_tree import ancestor_matrix, conv_taps, l2norm, solve_tree_delta_rule, tree_causal_conv1d
from ddtree.models import gdn_tree_triton
from ddtree.models.gdn_tree_triton import PUSH_MAX_NODES, rule_options, tree_conv, tree_delta_rule
from ddtree.models.hybrid_static import StaticHybridTarget
from ddtree.testing import check_budget_sequence, fp32_cuda_pair, per_node_delta_rule

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

VOCAB, NEW, BLOCK = 128, 96, 8
LENGTHS = (5, 13, 29, 200)  # 5 = the verify size of budget 4; 200 + 96 crosses the 256-row bucket
SEQUENCES = {
    "sizes-revisited": [4, 2, 3, 5, 6, 7, 8, 4],
    "all-strategies": ["ar", "chain", 1, 4, 16, 64, "mtp", 4],
}


@pytest.fixture(scope="module")
def setup():
    return fp32_cuda_pair(LENGTHS, NEW, BLOCK, VOCAB, seed=1, family="qwen35")


def _check_sequence(setup, target, drafter_kind: str, budgets) -> None:
    model, prompts, refs, dflash = setup
    check_budget_sequence(target, budgets, drafter_kind, prompts, refs, dflash, NEW, VOCAB, BLOCK)


@pytest.mark.parametrize("sequence", sorted(SEQUENCES))
@pytest.mark.parametrize("drafter_kind", ["replay", "dflash-graph"])
@pytest.mark.parametrize("graphs,fuse,attention,triton", [(True, True, "dense", None), (True, True, "dense", False),
                                                          (True, False, "dense", False), (False, False, "dense", False),
                                                          (True, True, "flex", None)],
                         ids=["graphs-fused-triton", "graphs-fused-torch", "graphs", "eager", "graphs-fused-flex"])
def test_budget_sequences_on_one_hybrid_target_are_greedy(setup, sequence, drafter_kind, graphs, fuse, attention,
                                                          triton):
    target = StaticHybridTarget(setup[0], max_length=512, cuda_graphs=graphs, fuse=fuse, attention=attention,
                                triton=triton, fuse_projections=False)
    assert target.triton == (triton is None and fuse)
    _check_sequence(setup, target, drafter_kind, SEQUENCES[sequence])


@pytest.mark.parametrize("sequence", sorted(SEQUENCES))
@pytest.mark.parametrize("drafter_kind", ["replay", "dflash-graph"])
def test_fused_projections_on_the_graphed_hybrid_are_greedy(setup, sequence, drafter_kind):
    """``fuse_projections=True`` (each layer's same-input projections as one GEMM) on the default fast
    path, on a copy of the model: fusing turns its weights into views of one tensor a group."""
    model = copy.deepcopy(setup[0])
    target = StaticHybridTarget(model, max_length=512, fuse_projections=True)
    assert target.fused_projections == 2 * model.config.num_hidden_layers
    _check_sequence((model, *setup[1:]), target, drafter_kind, SEQUENCES[sequence])


@pytest.mark.parametrize("attention", ["dense", "flex"])
def test_the_tree_block_mask_on_the_graphed_hybrid_is_greedy(setup, attention):
    """``mask=tree`` (the bool ``[n, n]`` block alone) on the graphed hybrid (projections unfused: the model is
    the module's)."""
    model, prompts, refs, dflash = setup
    check_budget_sequence(StaticHybridTarget(model, max_length=512, attention=attention, fuse_projections=False),
                          SEQUENCES["all-strategies"],
                          "dflash-graph", prompts, refs, dflash, NEW, VOCAB, BLOCK, mask="tree")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.sampled_from(["ar", "chain", 1, 2, 4, 7, 16, 64]), min_size=2, max_size=6))
def test_any_budget_order_is_greedy_on_the_hybrid(setup, steps):
    model = copy.deepcopy(setup[0])  # the default fast path (fused projections included) on a copy
    target = StaticHybridTarget(model, max_length=512)
    assert target.fused_projections == 2 * model.config.num_hidden_layers
    _check_sequence((model, *setup[1:]), target, "replay", steps)


@pytest.mark.parametrize("n, seed", [(1, 3), (17, 0), (65, 1), (257, 2)])
def test_gdn_tree_math_on_the_gpu_is_within_tolerance_of_the_fp64_recurrence(n, seed):
    gen = torch.Generator().manual_seed(seed)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    hk, h, dk, dv = 4, 12, 64, 64
    r = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    q, k, v, s0 = r(n, hk, dk), r(n, hk, dk), r(n, h, dv), r(h, dk, dv)
    g, beta = -2.0 * torch.rand(n, h, generator=gen, dtype=torch.float64), torch.rand(n, h, generator=gen,
                                                                                       dtype=torch.float64)
    want = per_node_delta_rule(q, k, v, g, beta, parents, s0)
    cuda = [x.float().cuda() for x in (q, k, v, g, beta)]
    result = solve_tree_delta_rule(*cuda, parents.cuda(), s0.float().cuda())
    # Stated tolerance: fp32 math on O(1) inputs, n <= 257 nodes, depth <= n.
    torch.testing.assert_close(result.out.double().cpu(), want, atol=2e-4, rtol=2e-4)
    # The Triton kernel (IEEE float32 dots), on the same inputs, within the same tolerance.
    qn, kn = (l2norm(q) * q.shape[-1] ** -0.5).float().cuda(), l2norm(k).float().cuda()
    anc = ancestor_matrix(parents.cuda())
    gamma = anc.double() @ g.cuda()
    # The blocks the library runs (``rule_options``). With 64-row blocks too (unused) the four sizes had
    # not finished within 200 s on an H200 (-n 8); which form was slow was not measured.
    forms = [{"split": False}, {"split": True}] + [{"split": True, "push": True}] * (n <= PUSH_MAX_NODES)
    for block, form in itertools.product((16, 32), forms):
        out, updates = tree_delta_rule(qn, kn, cuda[2], gamma.float(), cuda[4], s0.float().cuda(), anc, block=block,
                                       **form)
        torch.testing.assert_close(out.double().cpu(), want, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(updates, result.updates, atol=2e-4, rtol=2e-4)
    # tf32 dots, as bf16 models run them, in the form ``rule_options`` picks for n: stated tolerance
    # 2e-2 (the kernel bench's relative error is 1.1e-3 to 1.6e-3 at Qwen3.6-27B's geometry).
    # Its updates written into a given tensor (the fast path's stash), as the default path writes them.
    stash = torch.full((n, h, dv), float("nan"), device="cuda")
    out, updates = tree_delta_rule(qn, kn, cuda[2], gamma.float(), cuda[4], s0.float().cuda(), anc, precision="tf32",
                                   updates=stash, **rule_options(n, "tf32"))
    assert updates is stash
    torch.testing.assert_close(out.double().cpu(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(updates, result.updates, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("split", [False, True], ids=["one-kernel", "split"])
@pytest.mark.parametrize("n", [1, 65, 257])
def test_the_rule_s_output_in_the_model_dtype_is_the_float32_one_cast(n, split):
    """``out_dtype=torch.bfloat16`` (what ``tree_mix_triton`` asks for a bf16 model): the kernel's float32
    outputs rounded as ``.to(torch.bfloat16)`` rounds them, bitwise (Triton's interpreter truncates to
    bf16, so the CPU tests check float16 only)."""
    gen = torch.Generator().manual_seed(n)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    hk, h, dk, dv = 4, 12, 64, 64
    q, k = (l2norm(torch.randn(n, hk, dk, generator=gen)).cuda() for _ in range(2))
    v, s0 = torch.randn(n, h, dv, generator=gen).cuda(), torch.randn(h, dk, dv, generator=gen).cuda()
    gamma, beta = (-torch.rand(n, h, generator=gen)).cuda(), torch.rand(n, h, generator=gen).cuda()
    args = (q * dk**-0.5, k, v, gamma, beta, s0, ancestor_matrix(parents.cuda()))
    out32, updates32 = tree_delta_rule(*args, precision="tf32", block=16, split=split)
    out, updates = tree_delta_rule(*args, precision="tf32", block=16, split=split, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and torch.equal(out, out32.to(torch.bfloat16))
    assert torch.equal(updates, updates32)


@pytest.mark.parametrize("logits", [False, True], ids=["beta", "beta-logits"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 65, 257])
def test_the_one_launch_prologue_equals_its_two_kernels(n, dtype, logits):
    """``tree_prologue`` compiled on the GPU against ``tree_conv_heads`` then ``tree_decay``, at Qwen3.6-27B's
    GDN sizes (16 key heads and 48 value heads of 128): q, k, v, gamma, beta and the copy of x bit for bit,
    with x, a and beta strided column views of one projection's output, as the fused projections give. With
    ``beta_logits`` (what the fast path runs) beta is also within a few ulps of torch's sigmoid: 8 in float32
    (Triton's exp and division), 2 in bf16 (after the rounding to bf16)."""
    gen = torch.Generator().manual_seed(n)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    hk, h, dk, dv, k = 16, 48, 128, 128, 4
    key_dim, c = hk * dk, 2 * hk * dk + h * dv
    r = lambda *shape: torch.randn(*shape, generator=gen).to(dtype).cuda()  # noqa: E731
    projection = r(n, c + 2 * h + 8)  # x, then a and b, in one row as the fused GDN projection leaves them
    x, a = projection[:, :c], projection[:, c + 3:c + 3 + h]
    beta = projection[:, c + 3 + h:c + 3 + 2 * h]
    beta = beta if logits else beta.sigmoid()
    window, weight, bias = r(c, k), (0.5 * r(c, k)).to(dtype), r(c)
    a_log, dt_bias = torch.randn(h, generator=gen).cuda(), r(h)
    parents = parents.cuda()
    taps, anc = conv_taps(parents, k), ancestor_matrix(parents)
    conv = (x, window, weight, bias, taps, key_dim, dk)
    copy = torch.full((n, c), float("nan"), dtype=dtype, device="cuda")
    want = (*gdn_tree_triton.tree_conv_heads(*conv, copy=copy),
            *gdn_tree_triton.tree_decay(a, beta, a_log, dt_bias, anc, beta_logits=logits), copy)
    copy = torch.full_like(copy, float("nan"))
    got = (*gdn_tree_triton.tree_prologue(*conv, a, beta, a_log, dt_bias, anc, copy=copy, beta_logits=logits), copy)
    for name, have, expected in zip(("q", "k", "v", "gamma", "beta", "copy"), got, want):
        assert have.dtype == expected.dtype and torch.equal(have, expected), name
    if logits:
        ulps = 8 if dtype == torch.float32 else 2
        torch.testing.assert_close(got[4], beta.sigmoid().float(), atol=0, rtol=ulps * torch.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 65, 257])
def test_the_triton_tree_conv_equals_the_torch_tree_conv(n, dtype):
    """``tree_conv`` compiled on the GPU against ``tree_causal_conv1d`` on a random forest over Qwen3.6-27B's
    10240 conv channels: float32 against the float64 math within 1e-5; bf16 against the eager bf16 math
    (the same two roundings) within one bf16 rounding; with ``copy``, x itself lands there bit for bit."""
    gen = torch.Generator().manual_seed(n)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    if n > 7:
        parents[7] = -1
    c, k = 10240, 4
    r = lambda *shape: torch.randn(*shape, generator=gen).to(dtype).cuda()  # noqa: E731
    x, window, weight, bias = r(n, c), r(c, k), (0.5 * r(c, k)).to(dtype), r(c)
    taps = conv_taps(parents.cuda(), k)
    got = tree_conv(x, window, weight, bias, taps)
    copy = torch.full_like(x, float("nan"))  # the stash form: the same kernel also writes x itself
    torch.testing.assert_close(tree_conv(x, window, weight, bias, taps, copy=copy), got, atol=0, rtol=0)
    torch.testing.assert_close(copy, x, atol=0, rtol=0)
    if dtype == torch.float32:
        want = tree_causal_conv1d(x.double(), None, window.double(), weight.double(), bias.double(), taps)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(got, tree_causal_conv1d(x, None, window, weight, bias, taps), atol=1e-2, rtol=1.6e-2)


@pytest.mark.parametrize("a", [1, 5, 16])
def test_the_one_pass_commit_equals_the_commit_formula(a):
    """``commit_state`` compiled on the GPU, at Qwen3.6-27B's GDN sizes (16 key heads, 48 value heads of 128;
    8 of its 48 layers), from a 65-node stash: each layer's ``commit_delta_state`` of the same path in fp64,
    within 1e-5 (IEEE float32 dots)."""
    from ddtree.models.gdn_tree import DeltaTreeResult, commit_delta_state

    gen = torch.Generator().manual_seed(a)
    layers, n, hk, h, dk, dv = 8, 65, 16, 48, 128, 128
    x = lambda *shape: torch.randn(*shape, generator=gen).cuda()  # noqa: E731
    keys, updates = l2norm(x(layers, n, hk, dk)), x(layers, n, h, dv)
    gamma, state = -3 * torch.rand(layers, n, h, generator=gen).cuda(), x(layers, h, dk, dv)
    path = torch.tensor(sorted(torch.randperm(n - 1, generator=gen)[:a - 1].tolist()), dtype=torch.long)
    path = torch.cat([torch.zeros(1, dtype=torch.long), path + 1]).cuda()
    want = torch.stack([commit_delta_state(DeltaTreeResult(out=None, keys=keys[g].double(), updates=updates[g].double(),
                                                           log_decay=gamma[g].double(), initial_state=state[g].double()),
                                           path) for g in range(layers)])
    got = gdn_tree_triton.commit_state(state.clone(), gamma, keys, updates, path)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
