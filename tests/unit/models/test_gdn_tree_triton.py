"""The Triton tree delta rule against the torch math, run by Triton's interpreter on the CPU
(skipped where Triton is not installed, as in CI; the GPU suite runs it compiled)."""

import pytest
import torch

from ddtree.models import gdn_tree_triton
from ddtree.models.gdn_tree import ancestor_matrix, conv_taps, delta_rule_tensors, l2norm, tree_causal_conv1d
from ddtree.testing import triton_interpreted


@pytest.fixture
def interpreted():
    pytest.importorskip("triton")
    with triton_interpreted("ddtree.models.gdn_tree_kernels", gdn_tree_triton._kernels):
        yield


FORMS = {"one-kernel": {"split": False}, "split": {"split": True}, "push": {"split": True, "push": True}}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("n, r, block, value_block", [(1, 3, 16, 32), (17, 3, 16, 16), (40, 2, 32, 32), (70, 1, 16, 32)])
def test_kernel_matches_the_torch_tree_delta_rule(interpreted, n, r, block, value_block, form):
    gen = torch.Generator().manual_seed(n)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    if n > 5:
        parents[5] = -1  # a forest: a second root attached to the committed prefix
    hk, dk, dv = 2, 16, 32
    h = hk * r
    x = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    q, k, v, s0 = x(n, hk, dk), x(n, hk, dk), x(n, h, dv), x(h, dk, dv)
    g, beta = -torch.rand(n, h, generator=gen, dtype=torch.float64), torch.rand(n, h, generator=gen, dtype=torch.float64)
    anc = ancestor_matrix(parents)
    out, keys, updates, gamma, _ = delta_rule_tensors(q, k, v, g, beta, parents, s0, anc)
    got_out, got_updates = gdn_tree_triton.tree_delta_rule(
        (l2norm(q) * dk**-0.5).float(), keys.float(), v.float(), gamma.float(), beta.float(), s0.float(), anc,
        block=block, value_block=value_block, **FORMS[form])
    torch.testing.assert_close(got_out.double(), out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_updates.double(), updates, atol=1e-5, rtol=1e-5)
    # The updates written into a given tensor (the hybrid fast path's commit stash): the same values.
    stash = torch.full((n, h, dv), float("nan"))
    _, into = gdn_tree_triton.tree_delta_rule(
        (l2norm(q) * dk**-0.5).float(), keys.float(), v.float(), gamma.float(), beta.float(), s0.float(), anc,
        block=block, value_block=value_block, updates=stash, **FORMS[form])
    assert into is stash
    torch.testing.assert_close(stash, got_updates, atol=0, rtol=0)


@pytest.mark.parametrize("form", list(FORMS))
def test_the_output_stored_in_the_model_dtype_is_the_float32_one_cast(interpreted, form):
    """``out_dtype``: the kernel rounds its float32 outputs as ``.to(dtype)`` does (the layer's cast
    before its gated norm, which the kernel then saves), bitwise; the updates stay float32. Float16
    here: Triton's interpreter truncates to bfloat16 where compiled Triton rounds to nearest even, so
    bfloat16 is checked on the GPU (``tests/gpu/test_hybrid_fast_path.py -k model_dtype``)."""
    dtype = torch.float16
    gen = torch.Generator().manual_seed(7)
    n, hk, h, dk, dv = 20, 2, 4, 16, 32
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    q, k = (l2norm(torch.randn(n, hk, dk, generator=gen)) for _ in range(2))
    v, s0 = torch.randn(n, h, dv, generator=gen), torch.randn(h, dk, dv, generator=gen)
    gamma, beta = -torch.rand(n, h, generator=gen), torch.rand(n, h, generator=gen)
    args = (q * dk**-0.5, k, v, gamma, beta, s0, ancestor_matrix(parents))
    out32, updates32 = gdn_tree_triton.tree_delta_rule(*args, block=16, **FORMS[form])
    out, updates = gdn_tree_triton.tree_delta_rule(*args, block=16, out_dtype=dtype, **FORMS[form])
    assert out.dtype == dtype and updates.dtype == torch.float32
    assert torch.equal(out, out32.to(dtype)) and torch.equal(updates, updates32)


def test_bad_blocks_and_precision_are_refused():
    t = torch.zeros(2, 1, 16)
    with pytest.raises(ValueError, match="precision"):
        gdn_tree_triton.tree_delta_rule(t, t, torch.zeros(2, 1, 32), torch.zeros(2, 1), torch.zeros(2, 1),
                                        torch.zeros(1, 16, 32), torch.eye(2, dtype=torch.bool), precision="bf16")
    with pytest.raises(ValueError, match="power of two"):
        gdn_tree_triton.tree_delta_rule(t, t, torch.zeros(2, 1, 32), torch.zeros(2, 1), torch.zeros(2, 1),
                                        torch.zeros(1, 16, 32), torch.eye(2, dtype=torch.bool), block=24)
    with pytest.raises(ValueError, match="updates must be a contiguous"):
        gdn_tree_triton.tree_delta_rule(t, t, torch.zeros(2, 1, 32), torch.zeros(2, 1), torch.zeros(2, 1),
                                        torch.zeros(1, 16, 32), torch.eye(2, dtype=torch.bool),
                                        updates=torch.zeros(2, 1, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="push runs with split=True"):
        gdn_tree_triton.tree_delta_rule(t, t, torch.zeros(2, 1, 32), torch.zeros(2, 1), torch.zeros(2, 1),
                                        torch.zeros(1, 16, 32), torch.eye(2, dtype=torch.bool), push=True)
    big = torch.zeros(129, 1, 16)
    with pytest.raises(ValueError, match="at most 128 nodes"):
        gdn_tree_triton.tree_delta_rule(big, big, torch.zeros(129, 1, 32), torch.zeros(129, 1), torch.zeros(129, 1),
                                        torch.zeros(1, 16, 32), torch.eye(129, dtype=torch.bool), split=True, push=True)
    with pytest.raises(ValueError, match="copy must be a contiguous"):
        gdn_tree_triton.tree_conv(torch.zeros(2, 8), torch.zeros(8, 4), torch.zeros(8, 4), None,
                                  torch.zeros(2, 4, dtype=torch.long), copy=torch.zeros(8, 2).t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, channels, bias, strided", [(1, 24, False, False), (19, 40, True, True), (37, 300, False, False)])
def test_tree_conv_kernel_matches_the_torch_tree_conv(interpreted, n, channels, bias, strided, dtype):
    """``tree_conv`` against ``tree_causal_conv1d`` on random forests: taps into the window (roots and
    their children) and into x, channel and node tiles with ragged edges; float32 to 1e-6, bf16 to one
    rounding of the output; x with strided rows (a column slice of a fused projection) read in place."""
    gen = torch.Generator().manual_seed(n + channels)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    if n > 7:
        parents[7] = -1
    k = 4
    r = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    x = r(n, channels + 7)[:, 3:3 + channels] if strided else r(n, channels)  # strided: a fused projection's slice
    window, weight = r(channels, k), r(channels, k)
    b = r(channels) if bias else None
    taps = conv_taps(parents, k)
    want = tree_causal_conv1d(x, None, window, weight, b, taps)
    got = gdn_tree_triton.tree_conv(x, window, weight, b, taps, block_nodes=16, block_channels=32)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=1e-2, rtol=1.6e-2)
    torch.testing.assert_close(got, want, **tol)
    copy = torch.full((n, channels), float("nan"), dtype=dtype)  # the stash form: x itself, bit for bit
    torch.testing.assert_close(gdn_tree_triton.tree_conv(x, window, weight, b, taps, block_nodes=16,
                                                         block_channels=32, copy=copy), got, atol=0, rtol=0)
    torch.testing.assert_close(copy, x, atol=0, rtol=0)


@pytest.mark.parametrize("conv_kernel, fused_prologue", [(True, True), (True, False), (False, False)],
                         ids=["fused-prologue", "triton-conv", "compiled-conv"])
def test_tree_mix_triton_fills_the_commit_stash_and_equals_tree_mix(interpreted, monkeypatch, conv_kernel,
                                                                    fused_prologue):
    """``tree_mix_triton`` against ``tree_mix`` (the torch math) on a random forest, float32, with every
    stash output given as the fast path gives them (rows of ``[G, n, ...]`` slabs): the same out, keys,
    updates and log decay, and the slabs hold x, the keys, the updates and the log decay themselves."""
    from ddtree.models import fused
    from ddtree.models import gdn_tree_layer as layer

    monkeypatch.setattr(fused, "BACKEND", "eager")  # dynamo traces the writes; Inductor is the GPU suite's
    monkeypatch.setattr(fused, "_COMPILED", {})
    monkeypatch.setattr(layer, "TRITON_CONV", conv_kernel)
    monkeypatch.setattr(layer, "FUSED_PROLOGUE", fused_prologue)
    gen = torch.Generator().manual_seed(3)
    n, h, hk, dk, dv, k = 19, 4, 2, 16, 32, 4
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    parents[7] = -1
    c = 2 * hk * dk + h * dv
    r = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    logits = r(n, h)  # in_proj_b's output: tree_mix takes its sigmoid, tree_mix_triton the logits themselves
    args = (r(n, c), r(n, h), logits.sigmoid(), r(h), r(h), r(c, k), r(c, k), None, r(h, dk, dv),
            conv_taps(parents, k), ancestor_matrix(parents), hk * dk, h * dv, dk)
    out, keys, updates, log_decay, _ = layer.tree_mix(*args)
    assert layer.takes_logits(layer.tree_mix_triton) and not layer.takes_logits(layer.tree_mix)
    args = (*args[:2], logits, *args[3:])
    calls = []  # which prologue ran: the fused one calls tree_prologue
    prologue = gdn_tree_triton.tree_prologue
    monkeypatch.setattr(gdn_tree_triton, "tree_prologue", lambda *a, **k: calls.append(1) or prologue(*a, **k))
    slot, nan = 1, lambda *shape: torch.full((3, n, *shape), float("nan"))  # noqa: E731
    stash = dict(conv_copy=nan(c), updates_out=nan(h, dv), keys_out=nan(hk, dk), log_decay_out=nan(h))
    got = layer.tree_mix_triton(*args, **{name: slab[slot] for name, slab in stash.items()})
    assert bool(calls) == (conv_kernel and fused_prologue) == layer.fused_prologue(dk, hk * dk, c)
    tol = dict(atol=1e-5, rtol=1e-5)
    for want, have in zip((out, keys, updates, log_decay), got[:4]):
        torch.testing.assert_close(have, want, **tol)
    assert got[1].data_ptr() == stash["keys_out"][slot].data_ptr()  # the keys returned are the stash's rows
    for name, want in [("conv_copy", args[0]), ("keys_out", got[1]), ("updates_out", got[2]), ("log_decay_out", got[3])]:
        torch.testing.assert_close(stash[name][slot], want, atol=0, rtol=0)
        assert stash[name][[0, 2]].isnan().all()  # the other layers' rows untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, dk, dv, bias, strided", [(1, 16, 16, False, False), (19, 16, 48, True, True),
                                                      (37, 32, 32, False, False)])
def test_tree_conv_heads_matches_the_conv_and_the_compiled_prologue(interpreted, n, dk, dv, bias, strided, dtype):
    """``tree_conv_heads`` against ``tree_causal_conv1d`` then ``mix_inputs_after_conv``'s split, l2 norms
    and casts (torch math) on random forests: q, k and v in float32 to 1e-6 (bf16: the same rounding of the
    conv output, then float32 math, to one bf16 rounding as the conv's test allows: Triton's interpreter rounds
    bf16 its own way); the keys written into a given tensor and x into ``copy``, bit for bit."""
    from ddtree.models.gdn_tree_layer import mix_inputs_after_conv

    gen = torch.Generator().manual_seed(n + dk)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    if n > 7:
        parents[7] = -1
    hk, h, k = 2, 4, 4
    key_dim, c = hk * dk, 2 * hk * dk + h * dv
    r = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    x = r(n, c + 5)[:, 2:2 + c] if strided else r(n, c)
    window, weight = r(c, k), r(c, k)
    b = r(c) if bias else None
    taps, anc = conv_taps(parents, k), ancestor_matrix(parents)
    mixed = tree_causal_conv1d(x, None, window, weight, b, taps)
    a, beta = r(n, h), torch.rand(n, h, generator=gen).to(dtype)
    q, key, v, _, _ = mix_inputs_after_conv(mixed, a, beta, torch.zeros(h), torch.zeros(h), anc, key_dim, dk)
    keys, copy = torch.full((n, hk, dk), float("nan")), torch.full((n, c), float("nan"), dtype=dtype)
    got_q, got_k, got_v = gdn_tree_triton.tree_conv_heads(x, window, weight, b, taps, key_dim, dk, copy=copy,
                                                          keys_out=keys)
    assert got_k is keys and got_q.dtype == got_v.dtype == torch.float32
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=1e-2, rtol=1.6e-2)
    torch.testing.assert_close(got_q, q, **tol)
    torch.testing.assert_close(got_k, key, **tol)
    torch.testing.assert_close(got_v.view(n, h, dv), v, **tol)
    torch.testing.assert_close(copy, x, atol=0, rtol=0)


@pytest.mark.parametrize("n, h, strided", [(1, 4, False), (19, 48, True), (70, 5, False)])
def test_tree_decay_matches_the_torch_decay(interpreted, n, h, strided):
    """``tree_decay`` against ``mix_inputs_after_conv``'s gamma = anc @ g and beta in float32, on random
    forests with a past 20 (softplus is x there) and far below 0 (log1p of a tiny exp), bf16 inputs as the
    fast path gives them (a strided column view of a fused projection)."""
    from ddtree.models.gdn_tree_layer import mix_inputs_after_conv

    gen = torch.Generator().manual_seed(n + h)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    if n > 7:
        parents[7] = -1
    anc = ancestor_matrix(parents)
    a = (8 * torch.randn(n, h + 3, generator=gen))[:, 1:1 + h] if strided else 8 * torch.randn(n, h, generator=gen)
    a[0, 0], a[-1, -1] = 30.0, -40.0
    a = a.to(torch.bfloat16)
    logits = (4 * torch.randn(n, h, generator=gen)).to(torch.bfloat16)  # in_proj_b's output
    a_log, dt_bias = torch.randn(h, generator=gen), torch.randn(h, generator=gen).to(torch.bfloat16)
    mixed = torch.zeros(n, 16 * (2 + h), dtype=torch.bfloat16)  # one key head, a value head of 16 per head
    *_, gamma, beta32 = mix_inputs_after_conv(mixed, a, logits.sigmoid(), a_log, dt_bias, anc, 16, 16)
    out = torch.full((n, h), float("nan"))
    got_gamma, got_beta = gdn_tree_triton.tree_decay(a, logits.sigmoid(), a_log, dt_bias, anc, gamma_out=out)
    assert got_gamma is out
    torch.testing.assert_close(got_gamma, gamma, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_beta, beta32, atol=0, rtol=0)
    # The sigmoid in the kernel: the same gamma, beta within an ulp of bf16 (Triton's exp, the interpreter's
    # rounding to bf16).
    got_gamma, got_beta = gdn_tree_triton.tree_decay(a, logits, a_log, dt_bias, anc, beta_logits=True)
    torch.testing.assert_close(got_gamma, gamma, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_beta, beta32, atol=0, rtol=2**-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tree_decay_takes_the_sigmoid_of_beta_logits_as_torch_does(interpreted, dtype):
    """``beta_logits``: beta = sigmoid(b) in float32 rounded to b's dtype, within two ulps of that dtype of
    torch's ``b.sigmoid()`` (Triton's exp against torch's), over logits from -30 to 30."""
    n, h = 20, 6
    logits = torch.linspace(-30, 30, n * h).reshape(n, h).to(dtype)
    anc = ancestor_matrix(torch.arange(-1, n - 1))
    _, got = gdn_tree_triton.tree_decay(torch.zeros(n, h, dtype=dtype), logits, torch.zeros(h), torch.zeros(h), anc,
                                        beta_logits=True)
    want = logits.sigmoid().float()
    torch.testing.assert_close(got, want, atol=0, rtol=2 * torch.finfo(dtype).eps)


def test_tree_conv_heads_and_tree_decay_refuse_what_does_not_fit():
    x = torch.zeros(2, 3 * 24)
    with pytest.raises(ValueError, match="do not tile"):
        gdn_tree_triton.tree_conv_heads(x, torch.zeros(72, 4), torch.zeros(72, 4), None,
                                        torch.zeros(2, 4, dtype=torch.long), key_dim=24, dk=24)
    with pytest.raises(ValueError, match="keys_out must be a contiguous"):
        gdn_tree_triton.tree_conv_heads(torch.zeros(2, 64), torch.zeros(64, 4), torch.zeros(64, 4), None,
                                        torch.zeros(2, 4, dtype=torch.long), key_dim=16, dk=16,
                                        keys_out=torch.zeros(2, 1, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="gamma_out must be a contiguous"):
        gdn_tree_triton.tree_decay(torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(4), torch.zeros(4),
                                   torch.eye(2, dtype=torch.bool), gamma_out=torch.zeros(4, 2).t())


@pytest.mark.parametrize("logits", [False, True], ids=["beta", "beta-logits"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n, dk, dv, h, bias", [(1, 16, 16, 4, False), (5, 16, 48, 5, True), (19, 32, 32, 4, False),
                                                (37, 16, 16, 3, True)])
def test_tree_prologue_equals_tree_conv_heads_then_tree_decay(interpreted, n, dk, dv, h, bias, dtype, logits):
    """``tree_prologue`` (one launch) against ``tree_conv_heads`` then ``tree_decay`` on the same inputs, on
    random forests of one to three node blocks: q, k, v, gamma, beta and the copy of x bit for bit, with x, a
    and beta strided column views (a fused projection's output) and the keys and gamma written into given
    tensors. Float16 rather than bf16: Triton's interpreter rounds bf16 its own way."""
    gen = torch.Generator().manual_seed(n + dk + h)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    if n > 7:
        parents[7] = -1
    hk, k = 2, 4
    key_dim, c = hk * dk, 2 * hk * dk + h * dv
    r = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    x, window, weight = r(n, c + 5)[:, 2:2 + c], r(c, k), r(c, k)
    b = r(c) if bias else None
    projection = (8 * torch.randn(n, 2 * h + 3, generator=gen)).to(dtype)  # a and b side by side, as fused
    a, beta = projection[:, 1:1 + h], projection[:, 1 + h:1 + 2 * h]
    beta = beta if logits else beta.sigmoid()
    a_log, dt_bias = torch.randn(h, generator=gen), torch.randn(h, generator=gen).to(dtype)
    taps, anc = conv_taps(parents, k), ancestor_matrix(parents)
    conv = (x, window, weight, b, taps, key_dim, dk)
    outs = lambda: (torch.full((n, c), float("nan"), dtype=dtype), torch.full((n, hk, dk), float("nan")),  # noqa: E731
                    torch.full((n, h), float("nan")))
    copy, keys, gamma = outs()
    want = (*gdn_tree_triton.tree_conv_heads(*conv, copy=copy, keys_out=keys),
            *gdn_tree_triton.tree_decay(a, beta, a_log, dt_bias, anc, gamma_out=gamma, beta_logits=logits), copy)
    copy, keys, gamma = outs()
    got = (*gdn_tree_triton.tree_prologue(*conv, a, beta, a_log, dt_bias, anc, copy=copy, keys_out=keys,
                                          gamma_out=gamma, beta_logits=logits), copy)
    assert got[1] is keys and got[3] is gamma
    for name, have, expected in zip(("q", "k", "v", "gamma", "beta", "copy"), got, want):
        assert have.dtype == expected.dtype and torch.equal(have, expected), name


def test_tree_prologue_refuses_what_the_two_kernels_refuse():
    taps, anc = torch.zeros(2, 4, dtype=torch.long), torch.eye(2, dtype=torch.bool)
    decay = (torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(4), torch.zeros(4), anc)
    with pytest.raises(ValueError, match="do not tile"):
        gdn_tree_triton.tree_prologue(torch.zeros(2, 72), torch.zeros(72, 4), torch.zeros(72, 4), None, taps, 24, 24,
                                      *decay)
    conv = (torch.zeros(2, 64), torch.zeros(64, 4), torch.zeros(64, 4), None, taps, 16, 16)
    with pytest.raises(ValueError, match="keys_out must be a contiguous"):
        gdn_tree_triton.tree_prologue(*conv, *decay, keys_out=torch.zeros(2, 1, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="copy must be a contiguous"):
        gdn_tree_triton.tree_prologue(*conv, *decay, copy=torch.zeros(64, 2).t())
    with pytest.raises(ValueError, match="gamma_out must be a contiguous"):
        gdn_tree_triton.tree_prologue(*conv, *decay, gamma_out=torch.zeros(4, 2).t())


@pytest.mark.parametrize("path, r, value_block", [([0], 3, 32), ([0, 2, 5], 1, 48), ([1, 3, 4, 8, 9, 12, 13, 15, 16, 17, 18,
                                                                                     19, 20, 21, 22, 23, 24], 2, 32)])
def test_commit_state_keeps_the_path_in_one_pass(interpreted, path, r, value_block):
    """``commit_state`` (the hybrid fast path's commit of the recurrent state, in place) against
    ``commit_delta_state``'s S_a = e^{gamma_a} S0 + sum_j e^{gamma_a - gamma_j} k_j u_j^T per GDN layer, for
    paths of 1, 3 and 17 nodes (more than one 16-row tile) of a 25-node stash over two layers."""
    from ddtree.models.gdn_tree import DeltaTreeResult, commit_delta_state

    gen = torch.Generator().manual_seed(len(path))
    layers, n, hk, dk, dv = 2, 25, 2, 16, 64
    h = hk * r
    x = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    keys, updates, gamma = x(layers, n, hk, dk), x(layers, n, h, dv), -3 * torch.rand(layers, n, h, generator=gen)
    state = x(layers, h, dk, dv)
    want = torch.stack([commit_delta_state(DeltaTreeResult(out=None, keys=keys[g], updates=updates[g],
                                                           log_decay=gamma[g], initial_state=state[g]), path)
                        for g in range(layers)])
    got = state.clone()
    gdn_tree_triton.commit_state(got, gamma, keys, updates, torch.tensor(path), value_block=value_block)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_commit_state_refuses_what_it_cannot_write():
    state = torch.zeros(1, 2, 16, 16)
    stash = (torch.zeros(1, 3, 2), torch.zeros(1, 3, 1, 16), torch.zeros(1, 3, 2, 16))
    with pytest.raises(ValueError, match="contiguous float32"):
        gdn_tree_triton.commit_state(state.transpose(2, 3), *stash, torch.tensor([0]))
    with pytest.raises(ValueError, match="empty path"):
        gdn_tree_triton.commit_state(state, *stash, torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="node indices"):
        gdn_tree_triton.commit_state(state, *stash, torch.tensor([0.0]))
    with pytest.raises(ValueError, match="multiple of 16"):
        gdn_tree_triton.commit_state(torch.zeros(1, 2, 16, 24), *stash[:2], torch.zeros(1, 3, 2, 24), torch.tensor([0]))
    with pytest.raises(ValueError, match="updates must be a float32"):
        gdn_tree_triton.commit_state(state, *stash[:2], torch.zeros(1, 3, 2, 16, dtype=torch.float64), torch.tensor([0]))
    with pytest.raises(ValueError, match="keys must be a float32"):
        gdn_tree_triton.commit_state(state, stash[0], torch.zeros(1, 3, 1, 32), stash[2], torch.tensor([0]))


@pytest.mark.parametrize("arch", [86, 90])
@pytest.mark.parametrize("n", [4, 17, 65, 128])
def test_the_push_kernel_compiles_for_ampere_and_hopper(arch, n):
    """``tree_push_kernel`` built ahead of time at Qwen3.6-27B's head size (128 x 128, value blocks of 32,
    16-row blocks) with the launcher's warps, no GPU present: it fits an sm_86 block's shared memory."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = gdn_tree_triton._kernels().tree_push_kernel
    constexprs = {"N": n, "NP": 16 * -(-n // 16), "NR": max(gdn_tree_triton.tile(n), 16), "R": 3, "DK": 128,
                  "DV": 128, "BV": 32, "BT": 16, "KC": 32, "PRECISION": "tf32"}
    signature = {name: "constexpr" if name in constexprs else "*i8" if name == "anc_ptr"
                 else "*fp32" if name.endswith("_ptr") else "i32" for name in kernel.arg_names}
    try:
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", arch, 32), options={"num_warps": 8 if n > 64 else 4})
    except (FileNotFoundError, RuntimeError) as err:
        if "ptxas" in str(err):
            pytest.skip(f"no ptxas for an ahead-of-time build: {err}")
        raise
    assert compiled.metadata.shared <= 99 * 1024, compiled.metadata.shared
