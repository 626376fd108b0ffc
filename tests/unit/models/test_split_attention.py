"""The prefix/block split of a verify's attention (``ddtree.models.split_attention``) in fp32 on the
CPU, with ``prefix_reference`` in the flash kernel's place: segments, folding, masks and the merge
equal one dense softmax. The flash kernel itself is compared on a GPU (tests/gpu/test_long_context.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree.models import split_attention as sa
from ddtree.testing import (assert_prefix_segments, prefix_and_block_mask, random_tree_visibility,
                            triton_interpreted)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), past=st.integers(0, 700), kv_heads=st.sampled_from([1, 2, 4]),
       groups=st.sampled_from([1, 2, 3]), segments=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_split_equals_dense_attention_on_random_trees(n, past, kv_heads, groups, segments, seed):
    gen = torch.Generator().manual_seed(seed)
    length = past + n + int(torch.randint(0, 100, (), generator=gen))
    vis = random_tree_visibility(n, gen)
    q = torch.randn(1, kv_heads * groups, n, 16, generator=gen)
    k, v = (torch.randn(1, kv_heads, length, 16, generator=gen) for _ in range(2))
    mask = prefix_and_block_mask(past, vis, length)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = sa.split_attend(q, k, v, torch.tensor(past), torch.arange(past, past + n), vis, segments=segments,
                          prefix=sa.prefix_reference)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_segments_the_cut_leaves_empty_read_a_real_row_and_add_nothing():
    """No sequence reaches the kernel empty (its early exit is not trusted): an empty segment reads
    row P - 1 (row 0 at P = 0), and the merge drops it."""
    seen = []

    def recording(q, k, v, cu_q, starts, used, rows, max_k, scale):
        seen.append((starts.tolist(), used.tolist()))
        return sa.prefix_reference(q, k, v, cu_q, starts, used, rows, max_k, scale)

    gen = torch.Generator().manual_seed(1)
    for past in (0, 2, 9):
        n, length = 2, 20
        vis = torch.ones(n, n, dtype=torch.bool).tril()
        q = torch.randn(1, 2, n, 8, generator=gen)
        k, v = (torch.randn(1, 1, length, 8, generator=gen) for _ in range(2))
        mask = prefix_and_block_mask(past, vis, length)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        got = sa.split_attend(q, k, v, torch.tensor(past), torch.arange(past, past + n), vis, segments=4,
                              prefix=recording)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert seen == [([0, 0, 0, 0, 0], [1, 1, 1, 1]), ([0, 1, 1, 1, 1], [1, 1, 1, 1]), ([0, 3, 6, 8, 8], [3, 3, 3, 1])]


def test_empty_segments_add_nothing_and_the_scale_is_passed_on():
    gen = torch.Generator().manual_seed(0)
    n, past, length = 3, 2, 16  # 7 segments of a 2-row prefix: 5 are empty
    vis = torch.ones(n, n, dtype=torch.bool).tril()
    q = torch.randn(1, 2, n, 8, generator=gen)
    k, v = (torch.randn(1, 1, length, 8, generator=gen) for _ in range(2))
    mask = prefix_and_block_mask(past, vis, length)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, scale=0.3)
    got = sa.split_attend(q, k, v, torch.tensor(past), torch.arange(past, past + n), vis, scale=0.3, segments=7,
                          prefix=sa.prefix_reference)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_packed_and_padded_log_sum_exps_read_alike():
    lse = torch.arange(2 * 3 * 4, dtype=torch.float32)
    packed = lse.view(2, 3 * 4)  # [Hkv, S * rows]
    padded = lse.view(2, 3, 4).transpose(0, 1).contiguous()  # [S, Hkv, rows]
    for got in (sa._lse_by_segment(packed, 3, 2, 4), sa._lse_by_segment(torch.cat([padded, padded], -1), 3, 2, 4)):
        torch.testing.assert_close(got, padded)
        assert got.is_contiguous()  # what the compiled merge gets (see _lse_by_segment)


def test_the_split_stays_off_the_cpu_and_float32():
    q, k = torch.zeros(1, 4, 8, 64), torch.zeros(1, 2, 100, 64)
    assert not sa.splits(q, k) and not sa.splits(q.bfloat16(), k.bfloat16())
    assert sa.probe(torch.float32, torch.device("cpu")) is True  # nothing to probe: left as it is


def test_a_layout_computes_the_segments_once_a_forward_and_refresh_moves_them():
    """``FlexLayout.bounds``: one ``SegmentBounds`` per (S, rows) for every layer of a forward, rewritten
    in place by ``refresh`` when P moves; the split through it equals the split that cuts its own."""
    from ddtree.models.flex_attention import FlexLayout

    gen = torch.Generator().manual_seed(2)
    n, kv_heads, groups, length, segments = 3, 2, 2, 300, 5
    layout = FlexLayout(n, length, torch.device("cpu"), split=True)
    bounds = layout.bounds(segments, groups * n)
    assert layout.bounds(segments, groups * n) is bounds
    q = torch.randn(1, kv_heads * groups, n, 16, generator=gen)
    k, v = (torch.randn(1, kv_heads, length, 16, generator=gen) for _ in range(2))
    for past in (0, 1, 7, 200, length - n):
        vis = random_tree_visibility(n, gen)
        layout.set(past, vis)
        fresh = sa.SegmentBounds(torch.tensor(past), segments, groups * n)
        for name in ("lengths", "starts", "used", "cu_q"):
            assert getattr(bounds, name).tolist() == getattr(fresh, name).tolist(), (past, name)
        got = sa.split_attend(q, k, v, layout.past, layout.rows, layout.visible, segments=segments,
                              prefix=sa.prefix_reference, bounds=bounds)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=prefix_and_block_mask(past, vis, length),
                                                  enable_gqa=True)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="5 segments"):
        sa.split_attend(q, k, v, layout.past, layout.rows, layout.visible, segments=segments + 1,
                        prefix=sa.prefix_reference, bounds=bounds)


def test_a_shape_the_compiled_merge_gets_wrong_falls_back_to_the_plain_merge_then_to_flex(monkeypatch, caplog):
    """``serves``: the compiled merge where it agrees with the reference, else the plain merge, else None
    (FlexAttention); each shape is tried once, and a fallback is logged."""
    calls = []

    def disagreement(n, *args, merge=None, prefix=None, **kwargs):
        calls.append((n, merge))
        if n == 3:
            return 0.0 if merge is sa.block_and_merge else 7.0  # only the compiled merge is wrong
        if n == 4:
            raise RuntimeError("no kernel for this shape")
        return 0.0

    monkeypatch.setattr(sa, "_disagreement", disagreement)
    monkeypatch.setattr(sa, "_SERVES", {})
    k = torch.zeros(1, 2, 100, 16)
    with caplog.at_level("WARNING", logger=sa.__name__):
        assert sa.serves(torch.zeros(1, 4, 2, 16), k, 3) == (sa.prefix_flash, sa._merge_kernel(k.device))
        assert sa.serves(torch.zeros(1, 4, 3, 16), k, 3) == (sa.prefix_flash, sa.block_and_merge)
        assert sa.serves(torch.zeros(1, 4, 4, 16), k, 3) is None
        assert sa.serves(torch.zeros(1, 4, 3, 16), k, 3) == (sa.prefix_flash, sa.block_and_merge)  # remembered
    assert calls == [(2, None), (3, None), (3, sa.block_and_merge), (4, None), (4, sa.block_and_merge)]
    assert "differs from the reference by 7" in caplog.text and "the plain merge serves them" in caplog.text
    assert "RuntimeError: no kernel for this shape" in caplog.text and "FlexAttention serves them" in caplog.text


@pytest.fixture
def interpreted():
    pytest.importorskip("triton")
    with triton_interpreted("ddtree.models.split_merge_kernels", sa._triton_kernels):
        yield


@pytest.mark.parametrize("kv_heads, groups, d, n, segments, empty", [
    (2, 2, 16, 5, 3, 1), (1, 3, 24, 40, 2, 0), (2, 1, 32, 1, 4, 4), (1, 4, 16, 70, 1, 0), (2, 2, 64, 33, 5, 2),
    (2, 2, 96, 3, 10, 3), (1, 2, 128, 40, 6, 1), (1, 4, 16, 130, 3, 1)])
def test_the_triton_merge_equals_the_merge_in_tensor_ops(interpreted, kv_heads, groups, d, n, segments, empty):
    """``triton_merge`` (Triton's interpreter on the CPU, float32) against ``block_and_merge``: random
    trees, the prefix outputs in the strided layout the flash kernel leaves, ``empty`` segments with no
    keys (all of them: P = 0), head dims that are not powers of two, more rows than one program holds."""
    gen = torch.Generator().manual_seed(n * 7 + d)
    m = groups * n
    folded = torch.randn(kv_heads, m, d, generator=gen)
    keys, values = (torch.randn(kv_heads, n, d, generator=gen) for _ in range(2))
    visible = random_tree_visibility(n, gen)
    out = torch.randn(segments * m, kv_heads, d, generator=gen).view(segments, m, kv_heads, d).transpose(1, 2)
    lse = torch.randn(segments, kv_heads, m, generator=gen)
    lengths = torch.tensor([5] * (segments - empty) + [0] * empty)
    want = sa.block_and_merge(folded, keys, values, visible, out, lse, lengths, d**-0.5)
    got = sa.triton_merge(folded, keys, values, visible, out, lse, lengths, d**-0.5)
    assert got.dtype == folded.dtype
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_split_through_the_triton_merge_equals_dense_attention(interpreted):
    gen = torch.Generator().manual_seed(5)
    n, past, length = 9, 300, 400
    vis = random_tree_visibility(n, gen)
    q = torch.randn(1, 4, n, 16, generator=gen)
    k, v = (torch.randn(1, 2, length, 16, generator=gen) for _ in range(2))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=prefix_and_block_mask(past, vis, length),
                                              enable_gqa=True)
    got = sa.split_attend(q, k, v, torch.tensor(past), torch.arange(past, past + n), vis, segments=3,
                          prefix=sa.prefix_reference, merge=sa.triton_merge)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_heads, groups, d, n, past, segments", [
    (2, 2, 16, 5, 300, 3), (1, 3, 24, 40, 129, 2), (2, 1, 32, 1, 0, 4), (1, 4, 16, 70, 77, 1), (2, 2, 64, 3, 2, 5)])
def test_the_triton_prefix_equals_the_prefix_in_tensor_ops(interpreted, kv_heads, groups, d, n, past,
                                                            segments):
    """``prefix_triton`` (Triton's interpreter, float32) against plain math per segment: the cache
    buffers read in place through a strided view, segments the cut leaves empty (P = 0, P < S) with
    output 0 and log-sum-exp -inf, head dims that are not powers of two, more rows than one program."""
    gen = torch.Generator().manual_seed(n * 5 + d + past)
    m, length = groups * n, past + n + 40
    folded = torch.randn(kv_heads, m, d, generator=gen)
    k, v = (torch.randn(1, kv_heads, length, d, generator=gen) for _ in range(2))
    bounds = sa.SegmentBounds(torch.tensor(past), segments, m)
    out, lse = sa.prefix_triton(folded, k[0], v[0], bounds, d**-0.5)
    assert out.shape == (segments, kv_heads, m, d) and lse.shape == (segments, kv_heads, m)
    assert_prefix_segments(out, lse, folded, k[0], v[0], bounds, d**-0.5, tol=1e-5)


TRITON_SPLITS = {"prefix+merge": (sa.prefix_triton, sa.triton_merge),
                 "block-in-prefix+combine": (sa.prefix_block_triton, sa.triton_combine),
                 "block-in-prefix+tensor-combine": (sa.prefix_block_triton, sa.combine)}


@pytest.mark.parametrize("variant", list(TRITON_SPLITS))
@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 40), past=st.integers(0, 300), kv_heads=st.sampled_from([1, 2]),
       groups=st.sampled_from([1, 3]), segments=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_the_split_through_the_triton_prefix_and_merge_equals_dense_attention(variant, n, past, kv_heads, groups,
                                                                               segments, seed):
    """The Triton prefix with the Triton merge, and with the block part in the prefix launch as one more
    segment (``prefix_block_triton``) then ``triton_combine`` or ``combine``: dense attention's result
    on random trees, segments the cut leaves empty included."""
    pytest.importorskip("triton")
    prefix, merge = TRITON_SPLITS[variant]
    gen = torch.Generator().manual_seed(seed)
    length = past + n + 7
    vis = random_tree_visibility(n, gen)
    q = torch.randn(1, kv_heads * groups, n, 16, generator=gen)
    k, v = (torch.randn(1, kv_heads, length, 16, generator=gen) for _ in range(2))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=prefix_and_block_mask(past, vis, length),
                                              enable_gqa=True)
    with triton_interpreted("ddtree.models.split_merge_kernels", sa._triton_kernels):
        got = sa.split_attend(q, k, v, torch.tensor(past), torch.arange(past, past + n), vis, segments=segments,
                              prefix=prefix, merge=merge)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_serves_tries_the_triton_merge_between_the_compiled_and_the_plain_one(monkeypatch, caplog):
    """Below ``TRITON_FIRST_QUERIES`` queries: the compiled merge, then the Triton one, then the plain one."""
    tried = []

    def disagreement(n, *args, merge=None, prefix=None, **kwargs):
        tried.append(merge)
        return 0.0 if merge is sa.triton_merge else 1.0  # the compiled merge is wrong here

    monkeypatch.setattr(sa, "_disagreement", disagreement)
    monkeypatch.setattr(sa, "_SERVES", {})
    monkeypatch.setattr(sa, "triton_available", lambda device: True)
    monkeypatch.setattr(sa, "TRITON_PREFIX", False)
    n = sa.TRITON_FIRST_QUERIES - 1
    with caplog.at_level("WARNING", logger=sa.__name__):
        assert sa.serves(torch.zeros(1, 4, n, 16), torch.zeros(1, 2, 100, 16), 3) == (sa.prefix_flash, sa.triton_merge)
    assert tried == [None, sa.triton_merge]
    assert "the Triton merge serves them" in caplog.text


def test_from_triton_first_queries_on_serves_tries_the_triton_merge_first(monkeypatch, caplog):
    """Past ``TRITON_FIRST_QUERIES`` queries Triton is tried before the compiled merge (faster there);
    where it fails, the compiled one and then the plain one follow."""
    tried = []

    def disagreement(n, *args, merge=None, prefix=None, **kwargs):
        tried.append((n, merge))
        if n == sa.TRITON_FIRST_QUERIES + 1 and merge is sa.triton_merge:
            raise RuntimeError("out of resources")
        return 0.0

    monkeypatch.setattr(sa, "_disagreement", disagreement)
    monkeypatch.setattr(sa, "_SERVES", {})
    monkeypatch.setattr(sa, "triton_available", lambda device: True)
    monkeypatch.setattr(sa, "TRITON_PREFIX", False)  # the merges' order alone
    k, first = torch.zeros(1, 2, 100, 16), sa.TRITON_FIRST_QUERIES
    with caplog.at_level("WARNING", logger=sa.__name__):
        assert sa.serves(torch.zeros(1, 4, first - 1, 16), k, 3) == (sa.prefix_flash, sa._merge_kernel(k.device))
        assert sa.serves(torch.zeros(1, 4, first, 16), k, 3) == (sa.prefix_flash, sa.triton_merge)
        assert not caplog.text  # neither is a fallback
        assert sa.serves(torch.zeros(1, 4, first + 1, 16), k, 3) == (sa.prefix_flash, sa._merge_kernel(k.device))
    assert tried == [(first - 1, None), (first, sa.triton_merge), (first + 1, sa.triton_merge), (first + 1, None)]
    assert "Triton merge: RuntimeError: out of resources" in caplog.text and "the compiled merge serves" in caplog.text


def test_with_triton_prefix_on_serves_tries_the_triton_prefix_first_then_the_flash_one(monkeypatch, caplog):
    tried = []

    def disagreement(n, *args, merge=None, prefix=None, **kwargs):
        tried.append((n, prefix, merge))
        if n == 3 and prefix is sa.prefix_triton:
            return 2.0
        return 0.0

    monkeypatch.setattr(sa, "_disagreement", disagreement)
    monkeypatch.setattr(sa, "_SERVES", {})
    monkeypatch.setattr(sa, "TRITON_PREFIX", True)
    monkeypatch.setattr(sa, "triton_available", lambda device: True)
    k = torch.zeros(1, 2, 100, 16)
    with caplog.at_level("WARNING", logger=sa.__name__):
        assert sa.serves(torch.zeros(1, 4, 2, 16), k, 3) == (sa.prefix_triton, sa.triton_merge)
        assert not caplog.text
        assert sa.serves(torch.zeros(1, 4, 3, 16), k, 3) == (sa.prefix_flash, sa.triton_merge)
    assert tried == [(2, sa.prefix_triton, sa.triton_merge), (3, sa.prefix_triton, sa.triton_merge),
                     (3, sa.prefix_flash, sa.triton_merge)]
    assert "Triton prefix: differs from the reference by 2" in caplog.text


def test_with_fused_block_on_serves_tries_the_block_in_the_prefix_launch_first(monkeypatch, caplog):
    """``FUSED_BLOCK``: where the Triton prefix is tried, ``prefix_block_triton`` with ``triton_combine``
    comes before it; a shape it gets wrong falls back to the Triton prefix, logged."""
    tried = []

    def disagreement(n, *args, merge=None, prefix=None, **kwargs):
        tried.append((n, prefix, merge))
        return 3.0 if n == 3 and prefix is sa.prefix_block_triton else 0.0

    monkeypatch.setattr(sa, "_disagreement", disagreement)
    monkeypatch.setattr(sa, "_SERVES", {})
    monkeypatch.setattr(sa, "TRITON_PREFIX", None)
    monkeypatch.setattr(sa, "FUSED_BLOCK", True)
    monkeypatch.setattr(sa, "triton_available", lambda device: True)
    k = torch.zeros(1, 2, 100, 256)
    with caplog.at_level("WARNING", logger=sa.__name__):
        assert sa.serves(torch.zeros(1, 4, 2, 256), k, 3) == (sa.prefix_block_triton, sa.triton_combine)
        assert not caplog.text
        assert sa.serves(torch.zeros(1, 4, 3, 256), k, 3) == (sa.prefix_triton, sa.triton_merge)
        # One query of head dim 256: no Triton prefix first (``triton_prefix_first``), so no fused form either.
        assert sa.serves(torch.zeros(1, 4, 1, 256), k, 3)[0] is sa.prefix_flash
    assert tried[:3] == [(2, sa.prefix_block_triton, sa.triton_combine), (3, sa.prefix_block_triton, sa.triton_combine),
                         (3, sa.prefix_triton, sa.triton_merge)]
    assert "Triton prefix with the block: differs from the reference by 3" in caplog.text
    monkeypatch.setattr(sa, "triton_available", lambda device: False)  # no Triton: the flash prefix only
    assert [prefix for _, prefix, _ in sa._candidates(2, k.device, 16)] == [sa.prefix_flash] * 2


def test_by_default_the_triton_prefix_goes_first_where_it_was_measured_faster(monkeypatch):
    """``TRITON_PREFIX = None``: the Triton prefix first from 2 queries at head dim 256 and for 2 to 16
    at 128; one query, and longer blocks at 128, start with the flash prefix; True and False force it."""
    monkeypatch.setattr(sa, "triton_available", lambda device: True)
    monkeypatch.setattr(sa, "TRITON_PREFIX", None)
    first = lambda n, d: sa._candidates(n, torch.device("cpu"), d)[0][1]  # noqa: E731
    assert [first(n, 256) for n in (1, 2, 65, 257)] == [sa.prefix_flash] + [sa.prefix_triton] * 3
    assert [first(n, 128) for n in (1, 16, 17, 65)] == [sa.prefix_flash, sa.prefix_triton, sa.prefix_flash, sa.prefix_flash]
    monkeypatch.setattr(sa, "TRITON_PREFIX", True)
    assert first(65, 128) is sa.prefix_triton and first(1, 256) is sa.prefix_triton
    monkeypatch.setattr(sa, "TRITON_PREFIX", False)
    assert first(65, 256) is sa.prefix_flash


@pytest.mark.parametrize("rows", [6, 390, 1542])
@pytest.mark.parametrize("arch, dtype, head_dim", [(80, "fp16", 256), (86, "bf16", 256), (90, "bf16", 128),
                                                   (90, "bf16", 16)])
def test_the_triton_merge_compiles_for_ampere_and_hopper(arch, dtype, head_dim, rows):
    """Triton compiles the kernel ahead of time for sm_80 (A100), sm_86 (A6000) and sm_90 (H100/H200)
    with no GPU present, at the tile sizes ``triton_merge`` picks: a kernel that does not build for a
    card fails here, before any GPU run."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = sa._triton_kernels().block_merge_kernel
    floats = {"lse_ptr": "*fp32", "len_ptr": "*i64", "vis_ptr": "*i1", "scale": "fp32"}
    block_m, block_c, group = sa.merge_tiles(rows, head_dim)
    constexprs = {"BM": block_m, "BN": 32, "BD": head_dim, "BC": block_c, "SB": group, "PRECISION": "tf32"}
    signature = {name: "constexpr" if name in constexprs else floats.get(name, f"*{dtype}" if name.endswith("_ptr")
                 else "i32") for name in kernel.arg_names}
    try:
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", arch, 32))
    except (FileNotFoundError, RuntimeError) as err:
        if "ptxas" in str(err):
            pytest.skip(f"no ptxas for an ahead-of-time build: {err}")
        raise
    assert compiled.metadata.shared <= 99 * 1024  # fits an sm_86 block's shared memory


@pytest.mark.parametrize("with_block", [False, True], ids=["prefix", "with-block"])
@pytest.mark.parametrize("arch, dtype, head_dim", [(80, "fp16", 256), (86, "bf16", 256), (86, "bf16", 128),
                                                   (90, "bf16", 256), (90, "bf16", 128), (90, "fp32", 64)])
def test_the_triton_prefix_compiles_for_ampere_and_hopper(arch, dtype, head_dim, with_block):
    """``prefix_segment_kernel`` built ahead of time for sm_80/86/90 at ``PREFIX_TILES``' sizes, with
    no GPU present, alone and with the block part (``prefix_block_triton``): its tiles and pipeline
    stages fit an sm_86 block's shared memory."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = sa._triton_kernels().prefix_segment_kernel
    block_m, block_n, warps, stages, block_c = sa.prefix_tiles(head_dim)
    floats = {"lse_ptr": "*fp32", "len_ptr": "*i64", "start_ptr": "*i32", "scale": "fp32", "vis_ptr": "*i1"}
    constexprs = {"BM": block_m, "BN": block_n, "BD": head_dim, "BC": block_c,
                  "PRECISION": "ieee" if dtype == "fp32" else "tf32", "WITH_BLOCK": with_block}
    signature = {name: "constexpr" if name in constexprs else floats.get(name, f"*{dtype}" if name.endswith("_ptr")
                 else "i32") for name in kernel.arg_names}
    try:
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": warps, "num_stages": stages})
    except (FileNotFoundError, RuntimeError) as err:
        if "ptxas" in str(err):
            pytest.skip(f"no ptxas for an ahead-of-time build: {err}")
        raise
    assert compiled.metadata.shared <= 99 * 1024, compiled.metadata.shared



@pytest.mark.parametrize("tiles", [(16, 16, 4, 2, 16), (32, 16, 4, 2, 32)], ids=["bc16", "bc32"])
@pytest.mark.parametrize("variant", ["prefix+merge", "block-in-prefix+combine"])
def test_the_triton_prefix_with_output_column_chunks_equals_dense_attention(interpreted, monkeypatch, tiles, variant):
    """A fifth ``PREFIX_TILES`` entry (BC < the head dim: each program writes BC of the output's columns,
    its scores over the whole head dim), alone and with the block in the launch: dense attention's result,
    P = 0 (every segment empty) and P > 0, one query and a tree."""
    monkeypatch.setattr(sa, "PREFIX_TILES", {**sa.PREFIX_TILES, 64: tiles})
    prefix, merge = TRITON_SPLITS[variant]
    gen = torch.Generator().manual_seed(11)
    for past, n in ((0, 7), (100, 7), (50, 1)):
        length = past + n + 13
        vis = random_tree_visibility(n, gen)
        q = torch.randn(1, 4, n, 64, generator=gen)
        k, v = (torch.randn(1, 2, length, 64, generator=gen) for _ in range(2))
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=prefix_and_block_mask(past, vis, length),
                                                  enable_gqa=True)
        got = sa.split_attend(q, k, v, torch.tensor(past), torch.arange(past, past + n), vis, segments=3,
                              prefix=prefix, merge=merge)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
