"""Block-sparse FlexAttention on a GPU, in fp32 (run with ``pytest -m gpu`` on a machine with CUDA).

The compiled kernel against dense-mask SDPA on random trees and prefix lengths (one layout per
size, P rewritten in place, as a graph replays it), and the tokens of every strategy through a
graphed ``attention="flex"`` target against the eager target's own greedy text. The prompts make
generation cross several 128-row key blocks; the budget sequences revisit sizes after others.
"""

import pytest
import torch
import torch.nn.functional as F

from ddtree import SpeculativeEngine
from ddtree.drafters import DFlashDrafter, NullDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import split_attention
from ddtree.models.flex_attention import FlexLayout, attend
from ddtree.models.static_target import StaticTarget
from ddtree.testing import (assert_prefix_segments, check_budget_sequence, first_divergence, fp32_cuda_pair,
                            logit_gap, prefix_and_block_mask, random_tree_visibility)
from ddtree.trees import ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

VOCAB, NEW, BLOCK = 128, 160, 8
LENGTHS = (13, 250, 300, 517)  # 250 + 160 crosses the blocks at 256 and 384; 517 starts past 4 blocks
SEQUENCES = {
    "all-strategies": ["ar", "chain", 4, 16, 64],
    "sizes-revisited": [4, 64, 16, "ar", 4, "chain", 64],
}


@pytest.fixture(scope="module")
def setup():
    return fp32_cuda_pair(LENGTHS, NEW, BLOCK, VOCAB, seed=3)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("n", [1, 5, 16, 65, 129, 257])
@pytest.mark.parametrize("heads", [(32, 8, 128), (4, 2, 16)])
def test_compiled_kernel_equals_dense_sdpa_on_random_trees(n, heads, dtype, tol):
    torch.backends.cuda.matmul.allow_tf32 = False
    q_heads, kv_heads, dim = heads
    length = 3000
    gen = torch.Generator().manual_seed(n)
    layout = FlexLayout(n, length, torch.device("cuda"))
    k, v = (torch.randn(1, kv_heads, length, dim, generator=gen).to("cuda", dtype) for _ in range(2))
    for past in (0, 127, 128, 1000, length - n):  # one layout, rewritten in place
        vis = random_tree_visibility(n, gen)
        layout.set(past, vis.cuda())
        q = torch.randn(1, q_heads, n, dim, generator=gen).to("cuda", dtype)
        dense = prefix_and_block_mask(past, vis, length).cuda()
        expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=dense, enable_gqa=True)
        out = attend(q, k, v, layout.block_mask)
        torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


PREFIXES = {"flash": "prefix_flash", "triton": "prefix_triton", "triton-with-block": "prefix_block_triton",
            "triton-128-columns": "prefix_triton"}


@pytest.mark.parametrize("prefix", list(PREFIXES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 2, 5, 16, 65, 257])
@pytest.mark.parametrize("heads", [(32, 8, 128), (24, 4, 256), (4, 2, 16)])
def test_split_attention_equals_dense_sdpa_on_random_trees_in_one_graph(n, heads, dtype, prefix, monkeypatch):
    """The split of a layout with ``split`` on, its prefix through the flash kernel, ``prefix_triton``
    (and with programs of half the head dim's output columns) or ``prefix_block_triton`` (the block in
    the prefix launch), captured once in a CUDA graph and replayed at other prefix lengths (P and the
    visibility rewritten in place), against float32 dense SDPA of the same inputs; tolerance 2e-2,
    FlexAttention's in bf16 (the test above)."""
    monkeypatch.setattr(split_attention, "TRITON_PREFIX", prefix != "flash")
    monkeypatch.setattr(split_attention, "FUSED_BLOCK", prefix == "triton-with-block")
    if prefix == "triton-128-columns":
        tiles = dict(split_attention.PREFIX_TILES)
        for block_d, tile in tiles.items():
            tiles[block_d] = (*tile[:4], max(16, block_d // 2))
        monkeypatch.setattr(split_attention, "PREFIX_TILES", tiles)
    monkeypatch.setattr(split_attention, "_SERVES", {})
    torch.backends.cuda.matmul.allow_tf32 = False
    q_heads, kv_heads, dim = heads
    length = 3000
    gen = torch.Generator().manual_seed(n)
    layout = FlexLayout(n, length, torch.device("cuda"), split=True)
    k, v = (torch.randn(1, kv_heads, length, dim, generator=gen).to("cuda", dtype) for _ in range(2))
    q = torch.empty(1, q_heads, n, dim, device="cuda", dtype=dtype)
    layout.set(1000, torch.ones(n, n, dtype=torch.bool).tril().cuda())
    assert split_attention.probe(dtype, q.device)
    assert split_attention.splits(q, k) == (n >= split_attention.min_queries(dim))  # one query: head dim 256 only
    if split_attention.splits(q, k):  # the per-shape check must accept it: a refusal would test FlexAttention
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        segments = split_attention.segments_for(n, q_heads // kv_heads, kv_heads, length, sms)
        chosen = split_attention.serves(q, k, segments)
        assert chosen is not None
        assert chosen[0] is getattr(split_attention, PREFIXES[prefix])
    q.normal_()
    attend(q, k, v, layout.block_mask)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layout.refresh()
        out = attend(q, k, v, layout.block_mask)
    for past in (0, 1, 127, 128, 1000, length - n):
        vis = random_tree_visibility(n, gen)
        layout.past.fill_(past)
        layout.visible.copy_(vis)
        q.copy_(torch.randn(1, q_heads, n, dim, generator=gen))
        graph.replay()
        dense = prefix_and_block_mask(past, vis, length).cuda()
        expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=dense, enable_gqa=True)
        torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,n", [((24, 4, 256), 65), ((24, 4, 256), 257), ((4, 2, 16), 257), ((32, 8, 128), 65),
                                     ((32, 8, 128), 1)])
def test_the_triton_merge_equals_the_plain_merge_in_one_graph(heads, n, dtype):
    """``triton_merge`` compiled on the GPU against ``block_and_merge`` in float32, on the split's own
    inputs (the flash kernel's strided outputs, contiguous log-sum-exps, empty segments at P = 0 and 1),
    captured in a CUDA graph and replayed at several prefix lengths; tolerance 2e-2 as above. The
    first three shapes are those where the compiled merge went wrong on an H100."""
    q_heads, kv_heads, d = heads
    length, groups = 3000, q_heads // kv_heads
    gen = torch.Generator().manual_seed(n)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    segments = split_attention.segments_for(n, groups, kv_heads, length, sms)
    k, v = (torch.randn(1, kv_heads, length, d, generator=gen).to("cuda", dtype) for _ in range(2))
    q = torch.randn(1, q_heads, n, d, generator=gen).to("cuda", dtype)
    past = torch.zeros((), dtype=torch.long, device="cuda")
    rows, visible = torch.zeros(n, dtype=torch.long, device="cuda"), torch.zeros(n, n, dtype=torch.bool, device="cuda")

    def run():
        return split_attention.split_attend(q, k, v, past, rows, visible, segments=segments,
                                            merge=split_attention.triton_merge)

    def place(p, vis):
        past.fill_(p)
        torch.arange(p, p + n, out=rows)
        visible.copy_(vis)

    place(1000, random_tree_visibility(n, gen).cuda())
    run()  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for p in (0, 1, 127, 1000, length - n):
        place(p, random_tree_visibility(n, gen).cuda())
        graph.replay()
        expected = split_attention.split_attend(q, k, v, past, rows, visible, segments=segments,
                                                merge=split_attention.block_and_merge)
        torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-2)])
@pytest.mark.parametrize("heads,n", [((24, 4, 256), 65), ((24, 4, 256), 1), ((32, 8, 128), 257), ((32, 8, 128), 1),
                                     ((4, 2, 16), 5)])
def test_the_triton_prefix_equals_plain_math_per_segment_in_one_graph(heads, n, dtype, tol):
    """``prefix_triton`` compiled on the GPU, captured once and replayed at several P (segments the cut
    leaves empty at P = 0 and 1 included), against each segment's float32 softmax: outputs and
    log-sum-exps; float32 within 1e-5 (IEEE dots)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    q_heads, kv_heads, d = heads
    length, groups = 3000, q_heads // kv_heads
    m = groups * n
    gen = torch.Generator().manual_seed(n + d)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    segments = split_attention.segments_for(n, groups, kv_heads, length, sms)
    k, v = (torch.randn(1, kv_heads, length, d, generator=gen).to("cuda", dtype) for _ in range(2))
    folded = torch.randn(kv_heads, m, d, generator=gen).to("cuda", dtype)
    bounds = split_attention.SegmentBounds(torch.tensor(1000, device="cuda"), segments, m)
    split_attention.prefix_triton(folded, k[0], v[0], bounds, d**-0.5)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = split_attention.prefix_triton(folded, k[0], v[0], bounds, d**-0.5)
    for p in (0, 1, 127, 1000, length - n):
        bounds.update(torch.tensor(p, device="cuda"))
        graph.replay()
        assert_prefix_segments(out, lse, folded, k[0], v[0], bounds, d**-0.5, tol)


def test_one_graph_per_size_serves_every_prefix_length(setup):
    model, prompts, refs, _ = setup
    target = StaticTarget(model, max_length=1024, attention="flex", prefill_chunk=128)
    engine = SpeculativeEngine(target, NullDrafter(), ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier())
    for prompt, ref in zip(prompts, refs):
        assert engine.generate(prompt, max_new_tokens=NEW).tokens == ref[:NEW]
    assert sorted(target._flex_graphs) == [1] and not target._graphs


@pytest.mark.parametrize("sequence", sorted(SEQUENCES))
@pytest.mark.parametrize("drafter_kind", ["replay", "dflash-flex-graph"])
@pytest.mark.parametrize("attention,chunk", [("flex", 128), ("flex", 4096), ("auto", 128)])
def test_flex_graphed_strategies_are_greedy(setup, sequence, drafter_kind, attention, chunk):
    """``auto`` with a 256-row threshold switches from dense to flex graphs mid-generation."""
    model, prompts, refs, dflash = setup
    target = StaticTarget(model, max_length=1024, attention=attention, flex_threshold=256, prefill_chunk=chunk)
    check_budget_sequence(target, SEQUENCES[sequence], drafter_kind, prompts, refs, dflash, NEW, VOCAB, BLOCK, 1024)
    if attention == "auto":
        assert target._graphs and target._flex_graphs  # both kinds, one target


@pytest.mark.parametrize("fuse", [False, True], ids=["stock", "fused"])
def test_flex_drafter_graph_drafts_what_the_eager_drafter_drafts(setup, fuse):
    """The graphed FlexAttention drafter, with its norms, MLP and rotary as compiled kernels or not
    (``fuse``), drafts the eager stock drafter's log-probs within 1e-4 in fp32."""
    model, prompts, _, dflash = setup
    target = StaticTarget(model, max_length=1024, cuda_graphs=False, attention="dense")
    eager = DFlashDrafter(dflash, target, BLOCK, max_length=1024, attention="dense")
    graphed = DFlashDrafter(dflash, target, BLOCK, max_length=1024, cuda_graphs=True, attention="flex", fuse=fuse)
    target.set_taps(eager.hidden_layers)
    with torch.inference_mode():
        prompt = target.prefill(prompts[3].cuda())
        for drafter in (eager, graphed):
            drafter.reset(prompt)
        for root in (5, 9, 17):
            torch.testing.assert_close(graphed.draft(root).log_probs, eager.draft(root).log_probs, atol=1e-4, rtol=1e-4)
    assert graphed.fuse == fuse  # no silent fall back to the stock ops


@pytest.mark.parametrize("strategy", ["dflash", "ddtree-64"])
def test_split_attention_in_bf16_on_the_shipped_pair_is_greedy_up_to_near_ties(strategy):
    """End to end in bf16, the dtype the split serves: the shipped pair through the fast target and
    the graphed DFlash drafter with a 64-row threshold (so every verify and draft of a ~100-token
    prompt reads the prefix through split attention) gives eager AR's bf16 tokens, or parts from
    them only where the eager target's top-1/top-2 logit gap is below 0.25 (a near-tie)."""
    import json
    from pathlib import Path

    from ddtree.models import HFTarget
    from ddtree.models.dflash import DFlashDraftModel
    from ddtree.models.hub import load_causal_lm
    from ddtree.training.tokenizer import load_tokenizer
    from ddtree.trees import BestFirstTreeBuilder

    pair = Path(__file__).resolve().parents[2] / "assets" / "pair"
    model = load_causal_lm(pair / "target", dtype=torch.bfloat16, device_map="cuda").eval()
    dflash = DFlashDraftModel.from_pretrained(pair / "dflash", dtype=torch.bfloat16, device="cuda")
    tok = load_tokenizer(pair / "tokenizer")
    texts = [line for line in (pair / "heldout_prompts.jsonl").read_text().splitlines() if line.strip()][:2]
    prompts = [torch.tensor(tok.encode(json.loads(t)["text"])[-256:]) for t in texts]
    eager = SpeculativeEngine(HFTarget(model), NullDrafter(), ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier())
    target = StaticTarget(model, max_length=1024, attention="auto", flex_threshold=64)
    drafter = DFlashDrafter(dflash, target, max_length=1024, cuda_graphs=True, attention="auto", flex_threshold=64)
    builder = ChainTreeBuilder() if strategy == "dflash" else BestFirstTreeBuilder(64)
    fast = SpeculativeEngine(target, drafter, builder, DenseMaskCompiler(), GreedyVerifier())
    split_attention._SERVES.clear()
    for prompt in prompts:
        assert prompt.numel() > 64
        want = eager.generate(prompt, max_new_tokens=96).tokens
        got = fast.generate(prompt, max_new_tokens=96).tokens
        at = first_divergence(want, got)
        if at is not None:
            gap = logit_gap(model, prompt, want[:at])
            assert gap < 0.25, f"parted from eager AR at token {at}, where the logit gap is {gap:.3f}"
    assert split_attention._SERVES and None not in split_attention._SERVES.values()  # the split served every shape
