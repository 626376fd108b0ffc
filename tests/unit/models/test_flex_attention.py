"""Block-sparse FlexAttention (``ddtree.models.flex_attention``) is the dense-mask attention.

On the CPU, ``attend`` is the eager reference, which applies ``mask_mod`` everywhere and ignores
the block tables; the tables are checked on their own (every visible key in a listed block, full
blocks wholly visible, nothing listed past the query block), and once through the compiled CPU
kernel, which reads them.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree import SpeculativeEngine
from ddtree.drafters import NullDrafter, OracleDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import flex_attention as fa
from ddtree.models.flex_attention import KV_BLOCK, FlexLayout, attend
from ddtree.models.static_target import StaticTarget
from ddtree.testing import greedy_reference, prefix_and_block_mask, random_tree_visibility, tree_logits
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.types import Draft, Verification
from ddtree.verifiers import GreedyVerifier


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), past=st.integers(0, 400), kv_heads=st.sampled_from([1, 2, 4]),
       groups=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**16))
def test_flex_equals_dense_sdpa_on_random_trees(n, past, kv_heads, groups, seed):
    gen = torch.Generator().manual_seed(seed)
    length = past + n + int(torch.randint(0, 200, (), generator=gen))
    vis = random_tree_visibility(n, gen)
    layout = FlexLayout(n, length, torch.device("cpu"))
    layout.set(past, vis)
    q = torch.randn(1, kv_heads * groups, n, 16, generator=gen)
    k, v = (torch.randn(1, kv_heads, length, 16, generator=gen) for _ in range(2))
    mask = prefix_and_block_mask(past, vis, length)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(attend(q, k, v, layout.block_mask), expected, atol=1e-5, rtol=1e-5)
    assert layout.rows.tolist() == list(range(past, past + n))


def _readable(layout: FlexLayout, full: bool) -> torch.Tensor:
    """``[q_blocks, kv_length]``: the key columns the full (or partial) block tables list, per query block."""
    nums = (layout.full_num_blocks if full else layout.kv_num_blocks)[0, 0]
    indices = (layout.full_indices if full else layout.kv_indices)[0, 0]
    out = torch.zeros(nums.shape[0], layout.kv_length, dtype=torch.bool)
    for qb in range(nums.shape[0]):
        for j in indices[qb, : nums[qb]].tolist():
            out[qb, j * KV_BLOCK : (j + 1) * KV_BLOCK] = True
    return out


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), past=st.integers(0, 1000), seed=st.integers(0, 2**16))
def test_block_tables_list_every_visible_key_and_nothing_past_the_block(n, past, seed):
    gen = torch.Generator().manual_seed(seed)
    length = past + n + int(torch.randint(0, 300, (), generator=gen))
    vis = random_tree_visibility(n, gen)
    layout = FlexLayout(n, length, torch.device("cpu"))
    layout.set(past, vis)
    dense = prefix_and_block_mask(past, vis, length)  # [n, length]
    full, partial = _readable(layout, full=True), _readable(layout, full=False)
    assert not (full & partial).any()
    end = math.ceil((past + n) / KV_BLOCK) * KV_BLOCK
    for qb in range(math.ceil(n / KV_BLOCK)):
        rows = dense[qb * KV_BLOCK : (qb + 1) * KV_BLOCK]
        listed = full[qb] | partial[qb]
        assert not (rows & ~listed).any(), "a visible key in no listed block"
        assert rows[:, full[qb]].all(), "a full block with a hidden key"
        assert not listed[end:].any(), "a listed block past the query block"
        assert full[qb][: past // KV_BLOCK * KV_BLOCK].all(), "a block below P read through mask_mod"
    assert int(layout.kv_indices.max()) < math.ceil(length / KV_BLOCK)


def test_compiled_cpu_kernel_reads_the_tables_and_follows_p_in_place():
    try:
        compiled = torch.compile(fa.flex_attention, dynamic=False)
        layout = FlexLayout(5, 700, torch.device("cpu"))
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(1, 4, 5, 16, generator=gen)
        k, v = (torch.randn(1, 2, 700, 16, generator=gen) for _ in range(2))
        vis = random_tree_visibility(5, gen)
        for past in (250, 3, 126, 600):  # written in place: the one compiled kernel must follow
            layout.set(past, vis)
            with torch.inference_mode():
                out = compiled(q, k, v, block_mask=layout.block_mask, enable_gqa=True)
            mask = prefix_and_block_mask(past, vis, 700)
            expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    except (RuntimeError, ImportError, OSError) as err:  # no C++ compiler: nothing to check here
        if "ompil" not in str(err):
            raise
        pytest.skip(f"torch.compile does not work on this CPU: {err}")


def test_kernel_options_fit_the_decoding_tile_and_ampere_shared_memory():
    assert fa.kernel_options(1, 4, torch.bfloat16, (9, 0), head_dim=128) == {"BLOCK_M": 16}
    assert fa.kernel_options(16, 4, torch.bfloat16, (9, 0), head_dim=128) == {"BLOCK_M": 64}
    assert fa.kernel_options(65, 2, torch.bfloat16, (9, 0), head_dim=16) == {"BLOCK_M": 128}  # 130 rows: 128-row tiles
    assert fa.kernel_options(257, 4, torch.bfloat16, (9, 0), head_dim=128) == {}
    assert fa.kernel_options(257, 4, torch.bfloat16, (8, 6), head_dim=128) == {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2}
    assert fa.kernel_options(65, 4, torch.float32, (8, 6), head_dim=128)["BLOCK_M"] == 64


@pytest.mark.parametrize("n, groups, head_dim, block_m", [
    (65, 4, 128, 64),   # 260 stacked rows: a 128 x 128 tile would need 256 fp32 registers a thread for its output
    (127, 8, 128, 64),
    (65, 4, 64, 128),
    (17, 4, 256, 32),   # head dim 256 (Qwen3.5/3.6 attention): 32-row tiles
    (1, 8, 256, 16),
    (16, 4, 128, 64),   # as before: 64 x 128 fits
])
def test_decoding_tiles_keep_their_output_in_registers(n, groups, head_dim, block_m):
    """The decoding kernel (fewer than 128 queries) runs two warps a tile; a tile of more than
    64 x 128 outputs spills (a 65-node verify with 4 query heads per K/V head did not finish within 4
    minutes on an H100), so taller stacks of a wide head get shorter tiles."""
    for capability in ((9, 0), (8, 0), (8, 6)):
        options = fa.kernel_options(n, groups, torch.bfloat16, capability, head_dim=head_dim)
        assert options["BLOCK_M"] == min(block_m, 64 if capability == (8, 6) else 128)
        assert options["BLOCK_M"] * head_dim <= 64 * 128 or options["BLOCK_M"] == 16


@pytest.mark.parametrize("n, kv_length, splits", [
    (1, 131_584, 257),   # one query over a 131K-row buffer: splits of 512 rows (FlexAttention's own: 32 of 4112)
    (1, 33_280, 65),
    (16, 131_584, 64),   # a DFlash block: its partial outputs cap the count (64 x 32 heads x 16 x 128 x 4 B = 16 MiB)
    (65, 131_584, None),  # a 65-node tree: the cap is under the default, which stays
    (1, 8_192, None),     # 16 splits of 512 rows: under the default
])
def test_decoding_splits_follow_the_buffer_length(n, kv_length, splits):
    """The decoding kernel sizes its key splits by the buffer, so long static buffers get more splits
    (Qwen3-8B's 32 over 8 heads of 128 on a 132-multiprocessor GPU); without the buffer length or the
    multiprocessor count nothing changes."""
    options = fa.kernel_options(n, 4, torch.bfloat16, (9, 0), head_dim=128, kv_length=kv_length, kv_heads=8, sms=132)
    assert options.get("SPLIT_KV") == splits
    assert "SPLIT_KV" not in fa.kernel_options(n, 4, torch.bfloat16, (9, 0), head_dim=128)
    if splits:
        assert 4 * splits * 32 * n * 128 <= fa.DECODE_PARTIALS_BYTES


@pytest.mark.parametrize("chunk", [16, 64, 4096])
def test_flex_static_target_is_greedy_with_chunked_prefill(tiny_models, family, chunk):
    model = tiny_models[family]
    prompt = (torch.arange(150) * 7) % 90 + 3
    expected = greedy_reference(model, prompt, 40)
    target = StaticTarget(model, max_length=256, cuda_graphs=False, attention="flex", prefill_chunk=chunk)
    for drafter, tree in [(NullDrafter(), ChainTreeBuilder()),
                          (OracleDrafter(model, depth=7, swap_prob=0.3, sharpness=10), BestFirstTreeBuilder(16))]:
        engine = SpeculativeEngine(target, drafter, tree, DenseMaskCompiler(), GreedyVerifier())
        assert engine.generate(prompt, max_new_tokens=40).tokens == expected
    assert 1 in target._layouts and (chunk in target._layouts) == (chunk <= prompt.numel())


@torch.inference_mode()  # the CPU FlexAttention reference has no backward
def test_flex_verify_matches_dense_verify(tiny_models):
    model = tiny_models["qwen3"]
    dense = StaticTarget(model, max_length=400, cuda_graphs=False, attention="dense")
    flex = StaticTarget(model, max_length=400, cuda_graphs=False, attention="flex", prefill_chunk=128)
    prompt = torch.arange(2, 300) % 90
    draft = Draft(torch.log_softmax(torch.randn(4, 96, generator=torch.Generator().manual_seed(0)), -1))
    tree = BestFirstTreeBuilder(20).build(draft, root_token=7)
    torch.testing.assert_close(*tree_logits((dense, flex), prompt, tree), atol=1e-5, rtol=1e-5)


def test_auto_stays_dense_on_the_cpu_and_bad_choices_are_refused(tiny_models):
    model = tiny_models["qwen3"]
    target = StaticTarget(model, max_length=256, cuda_graphs=False, flex_threshold=1)
    engine = SpeculativeEngine(target, NullDrafter(), ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier())
    engine.generate(torch.arange(4, 17), max_new_tokens=4)
    assert target.attention == "auto" and not target._layouts
    with pytest.raises(ValueError, match="attention="):
        StaticTarget(model, max_length=64, cuda_graphs=False, attention="sparse")


@torch.inference_mode()
def test_flex_dflash_drafter_drafts_what_the_dense_one_drafts(tiny_models):
    from ddtree.drafters import DFlashDrafter
    from ddtree.models import HFTarget
    from ddtree.testing import tiny_dflash

    model = tiny_models["qwen3"]
    target = HFTarget(model)
    dflash = tiny_dflash(model, block_size=8)
    dense, flex, split = (DFlashDrafter(dflash, target, max_length=400, attention=a) for a in ("dense", "flex", "split"))
    assert dense._layout is None and flex._layout is not None and split._layout.split and not flex._layout.split
    assert (dense.attention, flex.attention, split.attention) == ("dense", "flex", "split")
    assert DFlashDrafter(dflash, target, max_length=400).attention == "dense"  # auto: no graphs here
    target.set_taps(dense.hidden_layers)
    prompt = target.prefill((torch.arange(200) * 5) % 90 + 3)
    for drafter in (dense, flex, split):
        drafter.reset(prompt)
    for root in (7, 11, 3):
        expected = dense.draft(root).log_probs
        torch.testing.assert_close(flex.draft(root).log_probs, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(split.draft(root).log_probs, expected, atol=1e-5, rtol=1e-5)  # float32: flex
        # and through the graph step (a device tensor for the length), as a CUDA graph replays it
        length = torch.tensor(flex.length)
        ids = torch.full((8,), dflash.config.mask_token_id)
        ids[0] = root
        torch.testing.assert_close(flex._block_log_probs(ids, length), expected, atol=1e-5, rtol=1e-5)
        tree = ChainTreeBuilder().build(Draft(expected), root)
        depth = root % 5  # accept a few nodes
        context = target.forward_tree(DenseMaskCompiler().compile(tree, target.past_length))
        path = tuple(range(depth + 1))
        verification = Verification(path=path, tokens=tuple(tree.tokens[list(path)].tolist()), bonus=1)
        for drafter in (dense, flex, split):
            drafter.accept(verification, context)
        target.commit(path)


@torch.inference_mode()
def test_long_prompts_are_handed_on_in_chunks_with_the_same_result(tiny_models):
    """A chunked flex prefill writes each chunk's taps into one buffer (equal to a dense prefill's),
    and the DFlash drafter absorbs a prompt in row chunks (drafting what one pass drafts)."""
    from ddtree.drafters import DFlashDrafter
    from ddtree.testing import tiny_dflash

    model = tiny_models["qwen3"]
    prompt = (torch.arange(150) * 7) % 90 + 3
    dense = StaticTarget(model, max_length=256, cuda_graphs=False, attention="dense")
    flex = StaticTarget(model, max_length=256, cuda_graphs=False, attention="flex", prefill_chunk=32)
    dflash = tiny_dflash(model, block_size=8)
    whole, chunked = (DFlashDrafter(dflash, dense, max_length=256) for _ in range(2))
    for target in (dense, flex):
        target.set_taps(whole.hidden_layers)
    want, got = dense.prefill(prompt), flex.prefill(prompt)
    torch.testing.assert_close(got.taps, want.taps, atol=1e-5, rtol=1e-5)
    chunked.absorb_chunk = 7  # 150 rows in 22 chunks
    for drafter in (whole, chunked):
        drafter.reset(want)
    for root in (5, 9):
        torch.testing.assert_close(chunked.draft(root).log_probs, whole.draft(root).log_probs, atol=1e-5, rtol=1e-5)


@torch.inference_mode()
@pytest.mark.parametrize("attention, chunk", [("flex", 32), ("dense", 4096)])
def test_prompt_taps_stream_into_the_dflash_drafter(tiny_models, family, attention, chunk):
    """The engine hands a DFlash drafter the prompt's taps chunk by chunk while the target prefills
    (``prompt_sink``): the target never returns them whole (on the chunked path, no chunk is larger
    than ``prefill_chunk``), the drafter's cache holds what a reset over the whole taps writes, and
    the tokens are the target's greedy ones."""
    from ddtree.testing import tiny_dflash_drafter

    model = tiny_models[family]
    prompt = (torch.arange(150) * 7) % 90 + 3
    target = StaticTarget(model, max_length=256, cuda_graphs=False, attention=attention, prefill_chunk=chunk)
    drafter = tiny_dflash_drafter(target)
    target.set_taps(drafter.hidden_layers)
    sink, rows = drafter.prompt_sink(), []
    out = target.prefill(prompt, taps_sink=lambda taps: (rows.append(taps.shape[0]), sink(taps)))
    drafter.reset(out)
    assert out.taps is None and rows == ([150 % chunk] + [chunk] * (150 // chunk) if attention == "flex" else [150])
    streamed = [k[:, :, :150].clone() for k in drafter._keys + drafter._values]
    drafter.reset(target.prefill(prompt))  # the whole taps at once, as before
    assert drafter.length == 150
    for got, want in zip(streamed, drafter._keys + drafter._values):
        torch.testing.assert_close(got, want[:, :, :150], atol=1e-6, rtol=1e-6)
    used = []
    drafter.prompt_sink = lambda make=drafter.prompt_sink: used.append(1) or make()
    engine = SpeculativeEngine(target, drafter, BestFirstTreeBuilder(12), DenseMaskCompiler(), GreedyVerifier())
    assert engine.generate(prompt, max_new_tokens=24).tokens == greedy_reference(model, prompt, 24)
    assert used == [1]

