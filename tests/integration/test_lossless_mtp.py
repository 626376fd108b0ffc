"""MTP and MTP-tree are lossless: T = 0 gives the target's greedy tokens, T > 0 its distribution.

A random head accepts almost nothing, so each target gets a head fitted to it first (a few
seconds of distillation on its own greedy text, ``fit_to_target``): multi-token acceptances
then really happen and the drafter's cache catch-up is exercised. A family is one entry of
TARGETS (model builder and target wrapper); families whose target support is missing skip.
"""


import pytest
import torch
from transformers import DynamicCache

from ddtree import SpeculativeEngine
from ddtree.drafters import MTPDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import HFTarget, MTPHead
from ddtree.models.mtp import fit_to_target
from ddtree.testing import (CHECK_ALPHA, CHECK_NEW, CHECK_PROMPT, CHECK_VOCAB, LockstepDrafter, chi_square_p_value,
                            continuation_distribution, sample_continuations, tiny_target)
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier, SamplingVerifier

# The T > 0 helpers (exact distribution, chi-square) of the sampling test, loaded by path: tests/ is no package.

NEW_TOKENS = 48
PROMPTS = [(1, 11), (7, 12), (23, 13)]  # (length, seed)
EXTRA_TRAINING_PROMPTS = 5


def _hybrid(**kwargs):
    from ddtree.models.hybrid import HybridTarget
    from ddtree.testing import tiny_hybrid_target

    model = tiny_hybrid_target(**kwargs)
    return model, HybridTarget(model)


def _plain(family: str, **kwargs):
    model = tiny_target(family, **kwargs)
    return model, HFTarget(model)


# family -> builder(**tiny_target kwargs) -> (model, target). Adding a family is one line here.
TARGETS = {
    "qwen3": lambda **kw: _plain("qwen3", **kw),
    "llama": lambda **kw: _plain("llama", **kw),
    "qwen3_5": _hybrid,
}


def _available(family: str) -> bool:
    try:
        with torch.random.fork_rng():  # building seeds torch; collection should not
            TARGETS[family](num_layers=1)
        return True
    except (ImportError, AttributeError, NotImplementedError):
        return False


FAMILY_PARAMS = [pytest.param(f, marks=pytest.mark.skipif(not _available(f), reason=f"no {f} target support"))
                 for f in TARGETS]
# name -> (draft steps, tree builder, top_k)
STRATEGIES = {
    "mtp1": (1, ChainTreeBuilder(), None),
    "mtp2": (2, ChainTreeBuilder(), None),
    "mtp3": (3, ChainTreeBuilder(), None),
    "mtp5": (5, ChainTreeBuilder(), None),
    "mtp-tree4": (4, BestFirstTreeBuilder(4), None),
    "mtp-tree16": (4, BestFirstTreeBuilder(16), None),
    "mtp-tree16-top2": (4, BestFirstTreeBuilder(16), 2),
}


def _prompt(length: int, seed: int, vocab: int = 90) -> torch.Tensor:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed))


def _greedy(model, prompt: torch.Tensor, new_tokens: int = NEW_TOKENS) -> list[int]:
    ids = prompt[None]  # an explicit mask: generate would otherwise mask prompt tokens equal to pad
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, prompt.numel():].tolist()


def _fit(model, prompts: list[torch.Tensor], temperature: float) -> MTPHead:
    """A head fitted on the prompts' greedy text."""
    seqs = [torch.cat([p, torch.tensor(_greedy(model, p))]) for p in prompts]
    head = MTPHead.for_target(model)
    fit_to_target(head, model, seqs, steps=100, depth=2, lr=1e-2, temperature=temperature)
    return head


@pytest.fixture(scope="module", params=FAMILY_PARAMS)
def fitted(request):
    model, target = TARGETS[request.param]()
    prompts = [_prompt(n, s) for n, s in PROMPTS] + [_prompt(7, 100 + i) for i in range(EXTRA_TRAINING_PROMPTS)]
    # A sharpened target suits greedy decoding: the head learns the argmax confidently.
    return request.param, model, target, _fit(model, prompts, temperature=0.25)


def _engine(target, head, steps, tree, top_k=None, verifier=None):
    drafter = MTPDrafter(head, target, steps=steps, top_k=top_k)
    return SpeculativeEngine(target, drafter, tree, DenseMaskCompiler(), verifier or GreedyVerifier())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_greedy_equals_target(fitted, strategy):
    family, model, target, head = fitted
    steps, tree, top_k = STRATEGIES[strategy]
    engine = _engine(target, head, steps, tree, top_k)
    taus = []
    for length, seed in PROMPTS:
        prompt = _prompt(length, seed)
        result = engine.generate(prompt, max_new_tokens=NEW_TOKENS)
        assert result.tokens == _greedy(model, prompt), f"{family} {strategy}, prompt length {length}"
        assert sum(result.acceptance_lengths) + 1 == NEW_TOKENS
        taus.append(result.mean_acceptance)
    tau = sum(taus) / len(taus)
    assert tau > 1.3, f"{family} {strategy}: tau {tau:.2f}, the test needs real multi-token acceptances"


def test_zero_steps_is_ar(fitted):
    family, model, target, head = fitted
    prompt = _prompt(7, 12)
    result = _engine(target, head, 0, ChainTreeBuilder()).generate(prompt, max_new_tokens=16)
    assert result.tokens == _greedy(model, prompt, 16) and result.mean_acceptance == 1.0


@pytest.mark.parametrize("strategy", ["mtp3", "mtp-tree16"])
def test_cache_equals_one_built_from_the_committed_sequence(fitted, strategy):
    """After any run the drafter's cache is the head fed the committed pairs (h_t, x_{t+1})."""
    family, model, target, head = fitted
    steps, tree, top_k = STRATEGIES[strategy]
    engine = _engine(target, head, steps, tree, top_k)
    prompt = _prompt(7, 12)
    result = engine.generate(prompt, max_new_tokens=NEW_TOKENS)
    assert result.mean_acceptance > 1.3
    drafter = engine.drafter
    drafter.catch_up()
    committed = torch.cat([prompt, torch.tensor(result.tokens[:-1])])  # the last token is the unfed bonus
    with torch.inference_mode():
        taps = target.prefill(committed).taps  # [N, H] one plain forward over the committed sequence
        fresh = DynamicCache()
        embeds = target.embed(committed[1:][None])
        head(embeds, taps[None, :-1], torch.arange(committed.numel() - 1)[None], fresh)
    assert drafter.length == committed.numel() - 1
    for mine, ref in zip(drafter.cache.layers, fresh.layers):
        torch.testing.assert_close(mine.keys, ref.keys, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(mine.values, ref.values, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(drafter._last, taps[-1], atol=2e-5, rtol=1e-4)  # h of the last token waits


@pytest.mark.parametrize("strategy,attention", [("mtp1", "dense"), ("mtp2", "dense"), ("mtp3", "dense"),
                                                ("mtp-tree16-top2", "dense"), ("mtp1", "flex"), ("mtp3", "flex"),
                                                ("mtp3", "split")])
def test_static_cache_drafts_equal_eager_and_decode_greedy(fitted, strategy, attention):
    """The fast path's static cache, op by op on the CPU (the code a CUDA graph replays, without
    the graph): every draft equals the eager drafter's, round by round, over prompts of several
    lengths on one engine (buffers reused), and the tokens are the target's greedy ones. With
    ``attention="flex"`` each forward of the chain reads the live rows through its ``FlexLayout``
    ("split": the same layouts, which on the CPU read them as "flex" does)."""
    family, model, target, head = fitted
    steps, tree, top_k = STRATEGIES[strategy]
    static = MTPDrafter(head, target, steps=steps, top_k=top_k, max_length=96, cuda_graphs=True, attention=attention)
    assert static._chain is not None and not static.cuda_graphs and static._chain.attention == attention
    twin = LockstepDrafter(static, MTPDrafter(head, target, steps=steps, top_k=top_k))
    engine = SpeculativeEngine(target, twin, tree, DenseMaskCompiler(), GreedyVerifier())
    taus, rounds = [], 0
    for length, seed in [*PROMPTS, (1, 11)]:  # the first prompt again: a sequence after others
        prompt = _prompt(length, seed)
        result = engine.generate(prompt, max_new_tokens=NEW_TOKENS)
        assert result.tokens == _greedy(model, prompt), f"{family} {strategy}, prompt length {length}"
        taus.append(result.mean_acceptance)
        rounds += len(result.acceptance_lengths)
    assert twin.rounds == rounds  # every draft was compared
    assert sum(taus) / len(taus) > 1.3, f"{family} {strategy}: the test needs multi-token acceptances"


def test_static_cache_absorbs_a_prompt_in_chunks(fitted, monkeypatch):
    """A prompt goes into the static cache ``absorb_chunk`` pairs at a time (no ``[n, n]`` mask):
    with 3-pair chunks every draft still equals the eager drafter's and the tokens are greedy."""
    from ddtree.drafters.mtp_static import StaticChain

    monkeypatch.setattr(StaticChain, "absorb_chunk", 3)
    family, model, target, head = fitted
    steps, tree, top_k = STRATEGIES["mtp3"]
    static = MTPDrafter(head, target, steps=steps, top_k=top_k, max_length=96, cuda_graphs=True)
    twin = LockstepDrafter(static, MTPDrafter(head, target, steps=steps, top_k=top_k))
    engine = SpeculativeEngine(target, twin, tree, DenseMaskCompiler(), GreedyVerifier())
    for length, seed in PROMPTS:
        prompt = _prompt(length, seed)
        assert engine.generate(prompt, max_new_tokens=NEW_TOKENS).tokens == _greedy(model, prompt)
    assert twin.rounds > 0


def test_prompt_pairs_enter_the_cache_at_reset(fitted):
    """The head's prefill is ``reset``'s work, not the first round's draft (which is decode time): after
    it the eager drafter holds the prompt's P - 1 pairs and queues none, the static chain holds all but
    the ``rows - 1`` its first draft takes with the root's pair; a short prompt stays queued there."""
    family, model, target, head = fitted
    steps = STRATEGIES["mtp3"][0]
    prompt = _prompt(23, 13)
    target.set_taps(MTPDrafter.hidden_layers)  # as the engine does before its prefill
    with torch.inference_mode():
        state = target.prefill(prompt)
    eager = MTPDrafter(head, target, steps=steps)
    eager.reset(state)
    assert (eager.length, eager._tokens) == (prompt.numel() - 1, [])
    assert eager.cache.layers[0].keys.shape[-2] == prompt.numel() - 1
    static = MTPDrafter(head, target, steps=steps, max_length=96, cuda_graphs=True)
    rows = static._chain.rows
    static.reset(state)
    assert (static.length, len(static._tokens)) == (prompt.numel() - rows, rows - 1)
    short = _prompt(2, 3)
    with torch.inference_mode():
        static.reset(target.prefill(short))
    assert (static.length, len(static._tokens)) == (0, 1)


def test_cuda_graphs_setting():
    model, target = TARGETS["qwen3"](num_layers=1)
    head = MTPHead.for_target(model)
    assert MTPDrafter(head, target, cuda_graphs="auto")._chain is None  # auto: eager off the GPU
    assert MTPDrafter(head, target, steps=0, cuda_graphs=True)._chain is None  # nothing to draft
    with pytest.raises(ValueError, match="cuda_graphs must be"):
        MTPDrafter(head, target, cuda_graphs="yes")
    with pytest.raises(ValueError, match="attention='sparse': choose one of"):
        MTPDrafter(head, target, cuda_graphs=True, attention="sparse")
    # auto: the dense mask off the GPU (FlexAttention only where graphed over a long cache)
    assert MTPDrafter(head, target, steps=3, max_length=8192, cuda_graphs=True)._chain.attention == "dense"
    drafter = MTPDrafter(head, target, steps=3, max_length=8, cuda_graphs=True)
    target.set_taps(drafter.hidden_layers)
    drafter.reset(target.prefill(_prompt(6, 0)))  # 5 pairs and the root's: 2 absorbed, then 4 + 3 rows from row 2
    with pytest.raises(ValueError, match="cache of 8 rows is full"):
        drafter.draft(5)


SAMPLES = 1200  # as the sampling test


# -- T > 0 ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_vocab():
    model, target = TARGETS["qwen3"](vocab_size=CHECK_VOCAB, seed=1)
    with torch.no_grad():  # the sampling test's target: a little more peaked, so drafts are accepted
        model.get_output_embeddings().weight.mul_(3.0)
    prompts = [CHECK_PROMPT] + [_prompt(5, 200 + i, CHECK_VOCAB) for i in range(7)]
    return model, target, _fit(model, prompts, temperature=1.0)


@pytest.mark.parametrize("name, temperature", [("mtp3", 1.0), ("mtp-tree6", 0.6)])
def test_first_tokens_follow_the_target_distribution(small_vocab, name, temperature):
    model, target, head = small_vocab
    tree = BestFirstTreeBuilder(6) if name == "mtp-tree6" else ChainTreeBuilder()
    engine = _engine(target, head, 3, tree, verifier=SamplingVerifier(temperature))
    counts, accepted = sample_continuations(engine, CHECK_PROMPT, CHECK_NEW, SAMPLES)
    probs = continuation_distribution(model, CHECK_PROMPT, CHECK_NEW, temperature)
    p_value = chi_square_p_value(counts, probs, SAMPLES)
    assert p_value > CHECK_ALPHA, f"{name} at T={temperature}: chi-square p = {p_value:.2e}"
    assert accepted > 0.3 * SAMPLES  # only meaningful if drafts are accepted
