"""Tree GDN math against sequential references, in float64 unless a test says otherwise.

The references run the plain token-by-token recurrence over each node's root path (and a
per-node parent-state loop); the layer tests compare against a real transformers
``Qwen3_5GatedDeltaNet`` fed the path after a prefix. transformers runs its delta rule in
float32 even for a float64 model, so layer-level tolerances are float32-sized.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree.models.gdn_tree import (
    ancestor_matrix,
    commit_conv_window,
    commit_delta_state,
    l2norm,
    solve_tree_delta_rule,
    tree_causal_conv1d,
    tree_gated_delta_rule,
)
from ddtree.models.gdn_tree_layer import (
    GDNState,
    commit_gdn_path,
    gdn_tree_forward,
    read_gdn_state,
    write_gdn_state,
)
from ddtree.testing import delta_step, per_node_delta_rule, prepare_qk

DT = torch.float64


# ---------------------------------------------------------------- trees


def chain(n: int) -> torch.Tensor:
    return torch.arange(-1, n - 1)


def star(n: int) -> torch.Tensor:
    return torch.tensor([-1] + [0] * (n - 1))


def random_tree(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    return torch.tensor(parents)


def root_path(parents: torch.Tensor, node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


TREES = {
    "single": torch.tensor([-1]),
    "chain": chain(12),
    "star": star(9),
    "forest": torch.tensor([-1, 0, -1, 2, 1, 2]),  # two nodes attached to the prefix
    **{f"random{n}": random_tree(n, seed=n) for n in (2, 5, 17, 40)},
}


# ---------------------------------------------------------------- sequential references


def path_conv(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """Token-by-token conv over a path (as causal_conv1d_update): outputs [p, C], final window."""
    outs = []
    for t in range(x.shape[0]):
        full = torch.cat([window, x[t, :, None]], dim=1)  # [C, K + 1]
        y = F.conv1d(full[None], weight[:, None, :], bias, groups=full.shape[0])[0, :, -1]
        outs.append(F.silu(y))
        window = full[:, 1:]
    return torch.stack(outs), window


def path_delta_rule(q, k, v, g, beta, s0):
    """Sequential recurrence along one path: outputs [p, H, dv], final state [H, dk, dv]."""
    q, k = prepare_qk(q, k, v.shape[1])
    s, outs = s0.clone(), []
    for t in range(q.shape[0]):
        o, s = delta_step(s, q[t], k[t], v[t], g[t], beta[t])
        outs.append(o)
    return torch.stack(outs), s


def random_gdn_inputs(n: int, seed: int, hk: int = 2, h: int = 4, dk: int = 8, dv: int = 6):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=gen, dtype=DT)  # noqa: E731
    q, k, v = r(n, hk, dk), r(n, hk, dk), r(n, h, dv)
    g = -2.0 * torch.rand(n, h, generator=gen, dtype=DT)  # decays down to e^-2 per token
    beta = torch.rand(n, h, generator=gen, dtype=DT)
    return q, k, v, g, beta, r(h, dk, dv)


# ---------------------------------------------------------------- ancestor table and conv


def test_ancestor_matrix_literal_and_random():
    parents = torch.tensor([-1, 0, 0, 1, 3, -1])
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 1, 0, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(ancestor_matrix(parents), expected)
    for parents in TREES.values():
        anc = ancestor_matrix(parents)
        for i in range(parents.shape[0]):
            assert anc[i].nonzero().flatten().tolist() == root_path(parents, i)


@pytest.mark.parametrize("kernel_size", [2, 4, 5])
@pytest.mark.parametrize("name", list(TREES))
def test_tree_conv_equals_path_conv(name, kernel_size):
    """Tolerance 1e-12 (float64): each node's conv over its root path after the window."""
    parents = TREES[name]
    n, c = parents.shape[0], 6
    gen = torch.Generator().manual_seed(kernel_size)
    x, window = torch.randn(n, c, generator=gen, dtype=DT), torch.randn(c, kernel_size, generator=gen, dtype=DT)
    weight, bias = torch.randn(c, kernel_size, generator=gen, dtype=DT), torch.randn(c, generator=gen, dtype=DT)
    for b in (None, bias):
        y = tree_causal_conv1d(x, parents, window, weight, b)
        for i in range(n):
            ref, _ = path_conv(x[root_path(parents, i)], window, weight, b)
            torch.testing.assert_close(y[i], ref[-1], atol=1e-12, rtol=0)


def test_tree_conv_never_reads_oldest_window_column():
    """transformers keeps K columns; the next token reads only the last K-1 (exact equality)."""
    parents, c, k = TREES["random17"], 3, 4
    x, window, weight = torch.randn(17, c, dtype=DT), torch.randn(c, k, dtype=DT), torch.randn(c, k, dtype=DT)
    changed = window.clone()
    changed[:, 0] = 1e6
    assert torch.equal(tree_causal_conv1d(x, parents, window, weight), tree_causal_conv1d(x, parents, changed, weight))


# ---------------------------------------------------------------- delta rule


@pytest.mark.parametrize("name", list(TREES))
def test_tree_delta_rule_equals_path_recurrence(name):
    """Tolerance 1e-10 (float64): node i's output equals the recurrence over its root path."""
    parents = TREES[name]
    q, k, v, g, beta, s0 = random_gdn_inputs(parents.shape[0], seed=parents.shape[0])
    for state in (s0, None):
        out = tree_gated_delta_rule(q, k, v, g, beta, parents, state)
        assert out.shape == v.shape and out.dtype == DT
        start = torch.zeros_like(s0) if state is None else s0
        for i in range(parents.shape[0]):
            p = root_path(parents, i)
            ref, _ = path_delta_rule(q[p], k[p], v[p], g[p], beta[p], start)
            torch.testing.assert_close(out[i], ref[-1], atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", list(TREES))
def test_tree_delta_rule_equals_per_node_reference(name):
    """Tolerance 1e-10 (float64), no GQA repeat (Hk == H), dk != dv."""
    parents = TREES[name]
    q, k, v, g, beta, s0 = random_gdn_inputs(parents.shape[0], seed=7, hk=3, h=3, dk=5, dv=7)
    out = tree_gated_delta_rule(q, k, v, g, beta, parents, s0)
    torch.testing.assert_close(out, per_node_delta_rule(q, k, v, g, beta, parents, s0), atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", list(TREES))
def test_commit_every_root_path_equals_sequential_run(name):
    """Tolerance 1e-10 (float64) for the state, exact for the window: accept each node's path."""
    parents = TREES[name]
    n, c, k = parents.shape[0], 5, 4
    q, kk, v, g, beta, s0 = random_gdn_inputs(n, seed=3)
    x, window = torch.randn(n, c, dtype=DT), torch.randn(c, k, dtype=DT)
    result = solve_tree_delta_rule(q, kk, v, g, beta, parents, s0)
    for i in range(n):
        p = root_path(parents, i)
        _, ref_state = path_delta_rule(q[p], kk[p], v[p], g[p], beta[p], s0)
        _, ref_window = path_conv(x[p], window, torch.randn(c, k, dtype=DT))
        torch.testing.assert_close(commit_delta_state(result, p), ref_state, atol=1e-10, rtol=0)
        assert torch.equal(commit_conv_window(x, window, p), ref_window)
    assert torch.equal(commit_delta_state(result, []), s0)
    assert torch.equal(commit_conv_window(x, window, []), window)


def test_chain_matches_transformers_chunk_kernel():
    """Tolerance 2e-5 (float32, as transformers computes): a chain is the chunked kernel's case."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    n = 70  # more than one 64-token chunk
    q, k, v, g, beta, s0 = (t.float() for t in random_gdn_inputs(n, seed=11))
    # Repeat the q/k heads here: 5.24's kernel repeats them itself, 5.17's layer did it before.
    rep = v.shape[1] // q.shape[1]
    ref_out, ref_state = torch_chunk_gated_delta_rule(
        q.repeat_interleave(rep, 1)[None], k.repeat_interleave(rep, 1)[None], v[None], g[None], beta[None],
        initial_state=s0[None], output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    result = solve_tree_delta_rule(q, k, v, g, beta, chain(n), s0)
    torch.testing.assert_close(result.out, ref_out[0], atol=2e-5, rtol=0)
    torch.testing.assert_close(commit_delta_state(result, list(range(n))), ref_state[0], atol=2e-5, rtol=0)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_property_random_trees(data):
    """Tolerance 1e-10 (float64) on hypothesis-drawn trees and head layouts."""
    n = data.draw(st.integers(1, 24))
    parents = torch.tensor([-1] + [data.draw(st.integers(-1, i - 1)) for i in range(1, n)])
    hk, rep = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    q, k, v, g, beta, s0 = random_gdn_inputs(n, seed=data.draw(st.integers(0, 10**6)), hk=hk, h=hk * rep, dk=4, dv=3)
    out = tree_gated_delta_rule(q, k, v, g, beta, parents, s0)
    torch.testing.assert_close(out, per_node_delta_rule(q, k, v, g, beta, parents, s0), atol=1e-10, rtol=0)
    node = data.draw(st.integers(0, n - 1))
    p = root_path(parents, node)
    _, ref_state = path_delta_rule(q[p], k[p], v[p], g[p], beta[p], s0)
    result = solve_tree_delta_rule(q, k, v, g, beta, parents, s0)
    torch.testing.assert_close(commit_delta_state(result, p), ref_state, atol=1e-10, rtol=0)


# ---------------------------------------------------------------- layer level, real transformers


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=12, linear_conv_kernel_dim=4,
    )
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(config).to(DT).eval()
    gdn = model.model.layers[0].linear_attn
    with torch.no_grad():
        # Default init decays up to e^-16 per token, which would hide errors in S0's handling.
        gdn.A_log.copy_(torch.empty_like(gdn.A_log).uniform_(-3.0, 0.0))
        gdn.dt_bias.normal_()
        gdn.norm.weight.normal_(1.0, 0.3)
        gdn.conv1d.weight.normal_(0.0, 0.5)
        # O(1) activations, so that the float32-sized absolute tolerances below are tight.
        for proj in (gdn.in_proj_qkv, gdn.in_proj_z, gdn.in_proj_b, gdn.in_proj_a, gdn.out_proj):
            proj.weight.normal_(0.0, proj.in_features**-0.5)
    return model


def prefilled_cache(model, prefix_len: int):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.randint(0, model.config.vocab_size, (1, prefix_len), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        model.model(ids, None, None, cache)  # positional: the cache kwarg is renamed between 5.17 and 5.24
    return cache


def snapshot(cache) -> tuple[torch.Tensor, torch.Tensor]:
    layer = cache.layers[0]
    return layer.conv_states[0].clone(), layer.recurrent_states[0].clone()


@pytest.mark.parametrize("prefix_len", [2, 9])  # 2 < K: transformers left-pads the window
@pytest.mark.parametrize("name", ["chain", "star", "random17"])
def test_layer_matches_transformers_on_every_path(tiny_model, name, prefix_len):
    """Tolerance 1e-5 on outputs of size ~1, 2e-6 on states of size ~0.1 (transformers' delta rule
    runs in float32, ours in float64; measured errors are ~4e-7 and ~2e-7)."""
    parents = TREES[name]
    gdn = tiny_model.model.layers[0].linear_attn
    cache = prefilled_cache(tiny_model, prefix_len)
    before = snapshot(cache)
    hidden = torch.randn(1, parents.shape[0], tiny_model.config.hidden_size, dtype=DT)
    with torch.no_grad():
        out, verify = gdn_tree_forward(gdn, hidden, parents, read_gdn_state(cache, 0, gdn.conv_kernel_size))
    after = snapshot(cache)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])  # cache untouched

    for i in range(parents.shape[0]):
        p = root_path(parents, i)
        real = copy.deepcopy(cache)
        with torch.no_grad():  # one call: the chunked path for |p| > 1, the decode path for |p| == 1
            ref = gdn(hidden[:, p], real)
        torch.testing.assert_close(out[0, i], ref[0, -1], atol=1e-5, rtol=0)
        committed = commit_gdn_path(verify, p)
        conv, recurrent = snapshot(real)
        torch.testing.assert_close(committed.conv_window, conv[0], atol=1e-12, rtol=0)
        torch.testing.assert_close(committed.recurrent_state.float(), recurrent[0], atol=2e-6, rtol=0)


def test_layer_commit_then_decode_matches_token_by_token(tiny_model):
    """Tolerance 1e-5: write the committed state, then the next real decode step agrees with a
    cache that consumed the accepted path one token at a time (the in-place decode path)."""
    parents = TREES["random17"]
    gdn = tiny_model.model.layers[0].linear_attn
    cache = prefilled_cache(tiny_model, 6)
    hidden = torch.randn(1, parents.shape[0] + 1, tiny_model.config.hidden_size, dtype=DT)
    tree_hidden, next_hidden = hidden[:, :-1], hidden[:, -1:]
    accepted = root_path(parents, parents.shape[0] - 1)
    real = copy.deepcopy(cache)
    with torch.no_grad():
        out, verify = gdn_tree_forward(gdn, tree_hidden, parents, read_gdn_state(cache, 0, gdn.conv_kernel_size))
        for t, node in enumerate(accepted):
            step = gdn(tree_hidden[:, node : node + 1], real)
            torch.testing.assert_close(out[0, node], step[0, 0], atol=1e-5, rtol=0)
        write_gdn_state(cache, 0, commit_gdn_path(verify, accepted))
        torch.testing.assert_close(gdn(next_hidden, cache), gdn(next_hidden, real), atol=1e-5, rtol=0)
    assert cache.layers[0].recurrent_states[0].dtype == torch.float32


def test_layer_empty_prefix_and_fresh_cache(tiny_model):
    """Tolerance 1e-5: with no prefix (state None) the tree pass equals a fresh transformers
    forward of each path, and writing into an uninitialised cache layer works."""
    from transformers import DynamicCache

    parents = TREES["star"]
    gdn = tiny_model.model.layers[0].linear_attn
    hidden = torch.randn(1, parents.shape[0], tiny_model.config.hidden_size, dtype=DT)
    with torch.no_grad():
        out, verify = gdn_tree_forward(gdn, hidden, parents, None)
        for i in range(parents.shape[0]):
            p = root_path(parents, i)
            real = DynamicCache(config=tiny_model.config)
            ref = gdn(hidden[:, p], real)
            torch.testing.assert_close(out[0, i], ref[0, -1], atol=1e-5, rtol=0)
        fresh = DynamicCache(config=tiny_model.config)
        assert read_gdn_state(fresh, 0, gdn.conv_kernel_size) is None
        state = commit_gdn_path(verify, p)
        write_gdn_state(fresh, 0, state)
        back = read_gdn_state(fresh, 0, gdn.conv_kernel_size)
        assert torch.equal(back.conv_window, state.conv_window)
        torch.testing.assert_close(back.recurrent_state, state.recurrent_state.float())
        nxt = torch.randn(1, 1, tiny_model.config.hidden_size, dtype=DT)
        torch.testing.assert_close(gdn(nxt, fresh), gdn(nxt, real), atol=1e-5, rtol=0)


def test_layer_float32_model_matches(tiny_model):
    """Tolerance 1e-4 on a float32 copy: same dtype path as a production fp32 run."""
    model = copy.deepcopy(tiny_model).float()
    gdn = model.model.layers[0].linear_attn
    parents = TREES["random5"]
    cache = prefilled_cache(model, 9)
    hidden = torch.randn(1, parents.shape[0], model.config.hidden_size)
    with torch.no_grad():
        out, verify = gdn_tree_forward(gdn, hidden, parents, read_gdn_state(cache, 0, gdn.conv_kernel_size))
        assert out.dtype == torch.float32 and verify.delta.out.dtype == torch.float32
        for i in range(parents.shape[0]):
            p = root_path(parents, i)
            real = copy.deepcopy(cache)
            ref = gdn(hidden[:, p], real)
            torch.testing.assert_close(out[0, i], ref[0, -1], atol=1e-4, rtol=0)
            state = commit_gdn_path(verify, p)
            torch.testing.assert_close(state.recurrent_state, real.layers[0].recurrent_states[0][0], atol=1e-4, rtol=0)


def test_gdn_state_is_frozen():
    state = GDNState(torch.zeros(2, 4), torch.zeros(1, 2, 2))
    with pytest.raises(AttributeError):
        state.conv_window = torch.ones(2, 4)
