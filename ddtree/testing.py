"""Tiny random-weight models for tests, notebooks and examples (nothing is downloaded)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Iterator

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from ddtree.models.dflash import DFlashConfig, DFlashDraftModel

FAMILIES = ("qwen3", "llama")


def tiny_target(family: str = "qwen3", vocab_size: int = 96, num_layers: int = 4, seed: int = 0,
                dtype: torch.dtype = torch.float32, max_positions: int = 1024):
    """A random-weight causal LM of the given family, small enough for CPU tests."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=max_positions,
        tie_word_embeddings=False, attn_implementation="sdpa",
    )
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    elif family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(f"unknown tiny family {family!r}; choose one of {FAMILIES}")
    # Sharper logits than the default init, so greedy text is not a sea of near-ties.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model.to(dtype).eval()


def tiny_dflash(target_model, block_size: int = 8, num_layers: int = 2, seed: int = 0,
                mask_token_id: int | None = None) -> DFlashDraftModel:
    """A random-weight DFlash drafter shaped for ``target_model``."""
    torch.manual_seed(seed)
    cfg = target_model.config
    n = cfg.num_hidden_layers
    layer_ids = tuple(sorted({min(1, n - 1), max(n - 2, 0)}))
    dcfg = DFlashConfig(
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, num_target_layers=n,
        mask_token_id=cfg.vocab_size - 1 if mask_token_id is None else mask_token_id,
        target_layer_ids=layer_ids, block_size=block_size, max_position_embeddings=cfg.max_position_embeddings,
    )
    return DFlashDraftModel(dcfg).to(target_model.dtype).eval()


def tiny_hybrid_target(vocab_size: int = 96, num_layers: int = 4, seed: int = 0,
                       dtype: torch.dtype = torch.float32, max_positions: int = 1024,
                       full_attention_interval: int = 2):
    """A random-weight Qwen3.5 hybrid LM: Gated DeltaNet layers, every ``full_attention_interval``-th
    layer full attention (default linear, full, linear, full: GDN layers after attention ones).

    The GDN layers are re-initialised so that they matter: the default init decays the state by up
    to e^-16 per token and keeps the projections tiny, which would hide state-handling errors.
    """
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
        layer_types=["full_attention" if (i + 1) % full_attention_interval == 0 else "linear_attention"
                     for i in range(num_layers)],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=max_positions,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, tie_word_embeddings=False, attn_implementation="sdpa",
    )
    model = Qwen3_5ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            gdn = getattr(layer, "linear_attn", None)
            if gdn is None:
                continue
            gdn.A_log.copy_(torch.empty_like(gdn.A_log).uniform_(-3.0, 0.0))  # decay e^-0.05..e^-1 per token
            gdn.dt_bias.normal_()
            gdn.norm.weight.normal_(1.0, 0.3)
            gdn.conv1d.weight.normal_(0.0, 0.5)
            for proj in (gdn.in_proj_qkv, gdn.in_proj_z, gdn.in_proj_b, gdn.in_proj_a):
                proj.weight.normal_(0.0, proj.in_features**-0.5)
            gdn.out_proj.weight.normal_(0.0, 0.5 * gdn.out_proj.in_features**-0.5)
        # Sharper logits than the default init, so greedy text is not a sea of near-ties.
        model.get_output_embeddings().weight.mul_(4.0)
    return model.to(dtype).eval()


# -- tokenizer and drafter factories for configs, demos and tests ------------------------------

TINY_SPECIAL_TOKENS = ("<pad>", "<unk>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>")
TINY_CHAT_TEMPLATE = (
    "{%- for m in messages -%}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{%- if m['role'] == 'assistant' -%}<eos>{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def tiny_tokenizer(vocab_size: int = 96):
    """A deterministic character-level tokenizer for the tiny targets (built in-process).

    Ids 0..5 are ``<pad> <unk> <eos> <|system|> <|user|> <|assistant|>``, then one id per
    character (newline, tab, space, letters, digits, punctuation) while ids stay below
    ``vocab_size``; other characters are ``<unk>``. eos is ``<eos>``. The chat template writes
    ``<|role|>content`` per message (``<eos>`` after assistant turns) and ``<|assistant|>`` as
    the generation prompt.

    >>> tok = tiny_tokenizer(96)
    >>> tok.decode(tok.encode("Hi!", add_special_tokens=False))
    'Hi!'
    """
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < len(TINY_SPECIAL_TOKENS) + 16:
        raise ValueError(f"tiny_tokenizer needs vocab_size >= {len(TINY_SPECIAL_TOKENS) + 16}, got {vocab_size}")
    alphabet = "\n\t " + string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation
    symbols = [*TINY_SPECIAL_TOKENS, *alphabet[: vocab_size - len(TINY_SPECIAL_TOKENS)]]
    backend = Tokenizer(models.WordLevel({s: i for i, s in enumerate(symbols)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per char
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(TINY_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                   eos_token="<eos>", chat_template=TINY_CHAT_TEMPLATE)


def tiny_dflash_drafter(target, block_size: int | None = 8, num_layers: int = 2, seed: int = 0):
    """A ``DFlashDrafter`` with random weights shaped for ``target`` (an ``HFTarget``); block 8 when None."""
    from ddtree.drafters.dflash import DFlashDrafter

    block_size = block_size or 8
    return DFlashDrafter(tiny_dflash(target.model, block_size=block_size, num_layers=num_layers, seed=seed),
                         target, block_size=block_size)


def oracle_drafter(target, depth: int = 7, swap_prob: float = 0.0, sharpness: float = 1.0, seed: int = 0):
    """An ``OracleDrafter`` asking ``target``'s own model (see ``ddtree.drafters.oracle``)."""
    from ddtree.drafters.oracle import OracleDrafter

    return OracleDrafter(target.model, depth=depth, swap_prob=swap_prob, sharpness=sharpness, seed=seed)


def tiny_mtp_drafter(target, steps: int = 3, seed: int = 0):
    """An ``MTPDrafter`` with a random MTP head shaped for ``target``."""
    from ddtree.drafters.mtp import MTPDrafter
    from ddtree.models.mtp import MTPHead

    return MTPDrafter(MTPHead.for_target(target.model, seed=seed), target, steps=steps)


@torch.no_grad()
def greedy_reference(model, prompt: torch.Tensor, max_new_tokens: int, eos_token_id: int | None = None) -> list[int]:
    """The target's own greedy continuation (``generate(do_sample=False)``), the T = 0 ground truth.

    The mask is passed explicitly: without one, ``generate`` takes prompt tokens equal to
    ``pad_token_id`` for padding.
    """
    ids = prompt.reshape(1, -1)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos_token_id, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


# -- the distribution check of the T > 0 tests ------------------------------------------------
# A target with a 4-token vocabulary has 64 possible 3-token continuations of a fixed prompt:
# their exact probabilities are enumerated, and a chi-square test compares them with what a
# strategy samples over many seeds (false-alarm rate CHECK_ALPHA for a correct sampler).
CHECK_VOCAB, CHECK_NEW, CHECK_ALPHA = 4, 3, 1e-3
CHECK_PROMPT = torch.tensor([1, 3, 0, 2, 2])


@torch.no_grad()
def continuation_distribution(model, prompt: torch.Tensor, new_tokens: int, temperature: float) -> dict:
    """Exact probability of every ``new_tokens``-token continuation under ``model`` at ``temperature``."""
    import itertools

    vocab = model.get_output_embeddings().weight.shape[0]
    seqs = list(itertools.product(range(vocab), repeat=new_tokens))
    ids = torch.cat([prompt.expand(len(seqs), -1), torch.tensor(seqs)], dim=1)
    logp = torch.log_softmax(model(ids).logits.double() / temperature, dim=-1)
    n = prompt.numel()
    picked = logp[:, n - 1 : n - 1 + new_tokens].gather(-1, torch.tensor(seqs)[..., None])[..., 0]  # [S, new]
    return {seq: float(p) for seq, p in zip(seqs, picked.sum(-1).exp())}


def sample_continuations(engine, prompt: torch.Tensor, new_tokens: int, samples: int) -> tuple[dict, int]:
    """Counts of the continuations ``engine`` generates for seeds 0..samples-1, and the number of
    accepted draft tokens (a check is only meaningful if drafts were accepted)."""
    counts, accepted = {}, 0
    for seed in range(samples):
        result = engine.generate(prompt, max_new_tokens=new_tokens, seed=seed)
        key = tuple(result.tokens)
        counts[key] = counts.get(key, 0) + 1
        accepted += sum(length - 1 for length in result.acceptance_lengths)
    return counts, accepted


def chi_square_p_value(counts: dict, probs: dict, total: int) -> float:
    """Goodness of fit of ``counts`` to ``probs``; cells expecting fewer than 5 are merged."""
    observed, expected, small_o, small_e = [], [], 0.0, 0.0
    for cell, p in probs.items():
        if p * total >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(p * total)
        else:
            small_o += counts.get(cell, 0)
            small_e += p * total
    if small_e > 0:
        observed.append(small_o)
        expected.append(small_e)
    o, e = torch.tensor(observed, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
    stat = ((o - e) ** 2 / e).sum()
    dof = torch.tensor((len(observed) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, stat / 2))


class ReplayDrafter:
    """Drafts a known continuation (the target's greedy text, say) without running any model.

    ``sequences`` are full token sequences (prompt + continuation); ``reset`` finds the one that
    starts with the prompt. At each depth the next known token gets most of the mass and a random
    other token the rest; with ``swap_prob`` the two trade places, so chains fail where trees with
    siblings still accept. ``hidden_layers`` are taps the target must capture (they are unused),
    so a test can exercise tap capture at no drafting cost. Fast enough for GPU test sweeps.
    """

    def __init__(self, sequences, vocab_size: int, depth: int = 7, swap_prob: float = 0.3, seed: int = 0,
                 hidden_layers: tuple[int, ...] = ()) -> None:
        self.sequences = [list(map(int, s)) for s in sequences]
        self.vocab_size, self.depth, self.swap_prob = vocab_size, depth, swap_prob
        self.hidden_layers = tuple(hidden_layers)
        self.rng = torch.Generator().manual_seed(seed)
        self.known: list[int] = []
        self.position = 0

    def reset(self, prompt) -> None:
        ids = prompt.tokens.tolist()
        self.known = next((s for s in self.sequences if s[: len(ids)] == ids), ids)
        self.position = len(ids)  # the bonus token sits at index position

    def draft(self, root_token: int):
        from ddtree.types import Draft

        logits = torch.full((self.depth, self.vocab_size), -12.0)
        for d in range(self.depth):
            i = self.position + 1 + d
            known = self.known[i] if i < len(self.known) else 0
            other = (known + 1 + int(torch.randint(0, self.vocab_size - 1, (), generator=self.rng))) % self.vocab_size
            first, second = (other, known) if torch.rand((), generator=self.rng) < self.swap_prob else (known, other)
            logits[d, first], logits[d, second] = 0.0, -2.0
        return Draft(torch.log_softmax(logits, dim=-1))

    def accept(self, verification, context) -> None:
        self.position += len(verification.tokens)


# -- the gated delta rule, token by token: the reference the tree forms are checked against ----

def delta_step(s, q, k, v, g, beta):
    """One token of the gated delta rule per head; q, k already normalised and repeated."""
    s = s * g.exp()[:, None, None]
    delta = (v - torch.einsum("hkv,hk->hv", s, k)) * beta[:, None]
    s = s + k[:, :, None] * delta[:, None, :]
    return torch.einsum("hkv,hk->hv", s, q), s


def prepare_qk(q, k, num_heads):
    from ddtree.models.gdn_tree import l2norm

    rep = num_heads // q.shape[1]
    q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
    return l2norm(q) * q.shape[-1] ** -0.5, l2norm(k)


def per_node_delta_rule(q, k, v, g, beta, parents, s0):
    """Reference semantics: node i starts from its parent's state (a root from s0)."""
    q, k = prepare_qk(q, k, v.shape[1])
    states, outs = [], []
    for i in range(q.shape[0]):
        start = s0 if parents[i] < 0 else states[int(parents[i])]
        o, s = delta_step(start, q[i], k[i], v[i], g[i], beta[i])
        states.append(s)
        outs.append(o)
    return torch.stack(outs)


# -- the GPU suite's budget sequences: one target serving engine after engine ------------------

def sequence_engine(target, budget, drafter_kind: str, prompts, refs, dflash, vocab: int, block: int,
                    max_length: int = 512, mask: str = "dense"):
    """The engine of one step of a budget sequence: ``budget`` is "ar", "chain", "mtp" (a random
    3-step MTP head) or a tree budget; ``drafter_kind`` "replay" (the known greedy text with swaps:
    long accepted paths at no drafting cost), "dflash-graph", "dflash-flex-graph" or "dflash-eager";
    ``mask`` "dense" (``DenseMaskCompiler``) or "tree" (``TreeMaskCompiler``, the bool tree block alone)."""
    from ddtree import SpeculativeEngine
    from ddtree.drafters import DFlashDrafter, NullDrafter
    from ddtree.masks import DenseMaskCompiler, TreeMaskCompiler
    from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
    from ddtree.verifiers import GreedyVerifier

    if budget == "ar":
        drafter, tree = NullDrafter(), ChainTreeBuilder()
    elif budget == "mtp":
        drafter, tree = tiny_mtp_drafter(target, steps=3), ChainTreeBuilder()
    else:
        tree = ChainTreeBuilder() if budget == "chain" else BestFirstTreeBuilder(budget)
        if drafter_kind == "replay":
            drafter = ReplayDrafter([p.tolist() + r for p, r in zip(prompts, refs)], vocab, depth=block - 1,
                                    hidden_layers=(1, 2))
        else:
            drafter = DFlashDrafter(dflash, target, block, max_length=max_length, cuda_graphs=drafter_kind != "dflash-eager",
                                    attention="flex" if drafter_kind == "dflash-flex-graph" else "auto")
    if mask not in ("dense", "tree"):
        raise ValueError(f"mask={mask!r}: choose dense or tree")
    compiler = TreeMaskCompiler() if mask == "tree" else DenseMaskCompiler()
    return SpeculativeEngine(target, drafter, tree, compiler, GreedyVerifier())


def check_budget_sequence(target, budgets, drafter_kind: str, prompts, refs, dflash, new: int, vocab: int,
                          block: int, max_length: int = 512, mask: str = "dense") -> None:
    """Every engine of the sequence, on the same target, returns the greedy reference on every prompt."""
    for budget in budgets:
        engine = sequence_engine(target, budget, drafter_kind, prompts, refs, dflash, vocab, block, max_length, mask)
        for prompt, ref in zip(prompts, refs):
            tokens = engine.generate(prompt, max_new_tokens=new).tokens
            assert tokens == ref[:new], f"budget {budget}, prompt of {prompt.numel()} tokens: parts at " \
                f"{next(i for i, (a, b) in enumerate(zip(tokens, ref)) if a != b)}"


def tree_logits(targets, prompt: torch.Tensor, tree) -> list[torch.Tensor]:
    """Each target prefilled with ``prompt``, then the logits ``[n, vocab]`` of one verify of ``tree``
    (laid out by the dense mask compiler): what two targets must agree on."""
    from ddtree.masks import DenseMaskCompiler

    outs = []
    for target in targets:
        target.prefill(prompt)
        outs.append(target.forward_tree(DenseMaskCompiler().compile(tree, target.past_length)).logits)
    return outs


def conditional_generation_twin(model):
    """The text weights of a tiny hybrid inside a ``Qwen3_5ForConditionalGeneration`` (text model at
    ``model.model.language_model``), as real Qwen3.5/3.6 checkpoints load."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=1)
    wrapped = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=model.config.to_dict(), vision_config=vision))
    wrapped.model.language_model.load_state_dict(model.model.state_dict())
    wrapped.lm_head.load_state_dict(model.lm_head.state_dict())
    return wrapped.eval()


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (None where one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@torch.inference_mode()
def logit_gap(model, prompt: torch.Tensor, continuation: list[int]) -> float:
    """Top-1 minus top-2 logit of ``model`` after ``prompt + continuation``: a bf16 divergence there is
    a near-tie only where this is below a stated threshold."""
    ids = torch.cat([prompt.cpu(), torch.tensor(continuation, dtype=torch.long)])[None]
    top = model(input_ids=ids.to(model.device)).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def prefix_and_block_mask(past: int, visible: torch.Tensor, length: int) -> torch.Tensor:
    """The bool ``[n, length]`` mask a verify's layout stands for: rows below ``past`` all visible, the
    block's own rows through ``visible`` ``[n, n]``, nothing past them."""
    n = visible.shape[0]
    mask = torch.zeros(n, length, dtype=torch.bool, device=visible.device)
    mask[:, :past] = True
    mask[:, past : past + n] = visible
    return mask


def assert_prefix_segments(out: torch.Tensor, lse: torch.Tensor, folded: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, bounds, scale: float, tol: float) -> None:
    """A split prefix kernel's segment outputs ``[S, Hkv, m, d]`` and log-sum-exps ``[S, Hkv, m]`` for
    ``folded`` ``[Hkv, m, d]`` queries over ``key``/``value`` ``[Hkv, L, d]`` against each segment's
    float32 softmax (``bounds``: its ``SegmentBounds``); a segment with no keys must give output 0 and
    log-sum-exp -inf."""
    for s, (first, count) in enumerate(zip(bounds.starts.tolist(), bounds.lengths.tolist())):
        if count == 0:
            assert torch.all(lse[s] == -torch.inf) and torch.all(out[s] == 0), f"segment {s} has no keys"
            continue
        scores = folded.float() @ key[:, first : first + count].float().transpose(-1, -2) * scale
        torch.testing.assert_close(lse[s], scores.logsumexp(-1), atol=tol, rtol=tol)
        torch.testing.assert_close(out[s].float(), scores.softmax(-1) @ value[:, first : first + count].float(),
                                   atol=tol, rtol=tol)


def random_tree_visibility(n: int, generator: torch.Generator) -> torch.Tensor:
    """The ``[n, n]`` bool ancestor mask of a random tree numbered parents first (row i: i and its ancestors)."""
    visible = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        if i:
            visible[i] = visible[int(torch.randint(0, i, (), generator=generator))]
        visible[i, i] = True
    return visible


def fp32_cuda_pair(lengths, new_tokens: int, block_size: int, vocab_size: int = 128, seed: int = 1,
                   family: str = "qwen3"):
    """For the GPU suite: a tiny fp32 target of ``family`` (qwen3, llama, or the hybrid qwen35) on CUDA
    with TF32 off, prompts of ``lengths``, each one's greedy text (``new_tokens + block_size`` tokens)
    and a tiny DFlash drafter for it."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if family == "qwen35":
        model = tiny_hybrid_target(vocab_size=vocab_size).cuda()
    else:
        model = tiny_target(family, vocab_size=vocab_size).cuda()
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(6, vocab_size - 8, (n,), generator=gen) for n in lengths]
    refs = [greedy_reference(model, p.cuda(), new_tokens + block_size) for p in prompts]
    return model, prompts, refs, tiny_dflash(model, block_size=block_size).cuda()


class LockstepDrafter:
    """Runs ``drafter`` and ``reference`` on the same calls and checks each of the first's drafts
    against the second's: the same top-1 token per depth, log-probs within ``atol``/``rtol``.
    The engine decodes with ``drafter``'s drafts; ``rounds`` counts the drafts compared.

    >>> twin = LockstepDrafter(MTPDrafter(head, t, cuda_graphs=True), MTPDrafter(head, t))   # doctest: +SKIP
    """

    def __init__(self, drafter, reference, atol: float = 1e-4, rtol: float = 1e-4) -> None:
        self.drafter, self.reference, self.atol, self.rtol = drafter, reference, atol, rtol
        self.hidden_layers = tuple(drafter.hidden_layers)
        self.rounds = 0

    def reset(self, prompt) -> None:
        self.drafter.reset(prompt)
        self.reference.reset(prompt)

    def draft(self, root_token: int):
        mine, ref = self.drafter.draft(root_token), self.reference.draft(root_token)
        where = f"draft {self.rounds} (root {root_token})"
        assert mine.log_probs.argmax(-1).tolist() == ref.log_probs.argmax(-1).tolist(), f"{where}: top-1 tokens differ"
        torch.testing.assert_close(mine.log_probs, ref.log_probs, atol=self.atol, rtol=self.rtol, msg=lambda m: f"{where}: {m}")
        self.rounds += 1
        return mine

    def accept(self, verification, context) -> None:
        self.drafter.accept(verification, context)
        self.reference.accept(verification, context)


@contextlib.contextmanager
def _scalar_loop_bounds() -> Iterator[None]:
    """Triton's interpreter (3.5 and 3.6) takes a runtime scalar as a loop bound (``range(0, n, BN)``) through
    ``int()`` of a one-element array, which NumPy refuses from 2.4 on ("only 0-dimensional arrays can be
    converted to Python scalars"). Inside the block it reads the element instead. Where the interpreter
    has no such hook, nothing changes."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        yield
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        yield
        return

    def patch(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patch
    try:
        yield
    finally:
        interpreter._patch_lang_tensor = original


@contextlib.contextmanager
def triton_interpreted(module: str, *loaders) -> Iterator[None]:
    """Run the Triton kernels of ``module`` (a module name, imported lazily through the
    ``functools.cache``d ``loaders``) by Triton's interpreter on the CPU inside the context:
    ``TRITON_INTERPRET`` is read when kernels are decorated, so the module is imported afresh.

    >>> with triton_interpreted("ddtree.models.split_merge_kernels", split_attention._triton_kernels):  # doctest: +SKIP
    ...     split_attention.triton_merge(...)
    """
    def forget() -> None:  # the module, its parent package's attribute for it, the loaders' caches
        sys.modules.pop(module, None)
        parent, _, name = module.rpartition(".")
        if parent in sys.modules and name in vars(sys.modules[parent]):
            delattr(sys.modules[parent], name)  # else ``from parent import name`` returns the stale one
        for loader in loaders:
            loader.cache_clear()

    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    forget()
    try:
        with _scalar_loop_bounds():
            yield
    finally:
        forget()
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


class GraphCaptureAudit:
    """The memory a CUDA-graph recording reads or writes that it did not allocate itself, and whether
    each piece is still held once the recording is done: ``fake_cuda_graphs``' report.

    A graph replays raw addresses. A tensor it uses that was allocated before the capture must stay
    referenced for as long as the graph lives; freed, the allocator hands its memory to other tensors
    and every replay reads or writes theirs. Tensors allocated inside the capture live in the graph's
    own pool and need no owner."""

    def __init__(self) -> None:
        self.used: dict[int, str] = {}  # storage address -> the first op that touched it
        self.made: set[int] = set()  # storages allocated inside the capture

    def freed(self) -> dict[int, str]:
        """The storages the capture used, did not allocate, and nothing references any more."""
        import gc
        import warnings

        gc.collect()
        with warnings.catch_warnings():  # isinstance on some deprecated module attributes warns
            warnings.simplefilter("ignore")
            tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
        live = set()
        for t in tensors:
            try:
                live.add(t.untyped_storage().data_ptr())
            except RuntimeError:  # a compiler's fake tensor has no memory
                continue
        return {ptr: op for ptr, op in self.used.items() if ptr not in live}


@contextlib.contextmanager
def fake_cuda_graphs(replay: bool = False) -> Iterator[GraphCaptureAudit]:
    """Run code that records CUDA graphs on the CPU: what runs inside ``torch.cuda.graph(...)`` runs
    eagerly under an audit of the tensors it touches (``GraphCaptureAudit``), and streams become
    no-ops. Lets a CPU test check that a recording keeps every buffer its graph uses, which only a GPU
    would otherwise show (as wrong tokens). FlexAttention, which compiles itself where no dispatch mode
    may watch, runs unwatched; its inputs, block tables and the tensors its mask function closes over
    are noted instead. Run the recording without autograd (``torch.inference_mode()``, as the loop
    does): FlexAttention on the CPU refuses it. Compiled functions (``fuse``) cannot run under it.

    ``replay=False``: a replay does nothing. ``replay=True``: the capture also records each op with
    the very tensors it read and wrote, and a replay runs them again, writing each result into the
    tensor the capture produced, as a graph replays its kernels over the same memory. Whatever the
    capture took from Python (a length, a shape, a branch) stays as it was at capture time, as on a
    GPU; a host sync inside the capture (``.item()``, ``.tolist()``) is refused, as a GPU refuses it.
    So the graphed loop's logic runs on the CPU: the tokens it gives there are the tokens its graphs
    give on a GPU, kernels' rounding aside.

    >>> with fake_cuda_graphs() as audit:                 # doctest: +SKIP
    ...     out = target.forward_tree(inputs)             # a target built for the CPU, cuda_graphs then set
    >>> audit.freed()                                     # doctest: +SKIP
    {}
    """
    from unittest import mock

    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
    from torch.utils._pytree import tree_leaves

    from ddtree.models import flex_attention as flex_module

    audit = GraphCaptureAudit()
    capturing: list = []  # the graph being recorded, while one is

    def note(run, inputs, outputs, op: str, fresh: bool = True) -> None:
        """Audit one op of a capture and, for replays, record ``run``. ``fresh``: its results are new
        tensors, written back into these at each replay; those that share an input's memory are views,
        whatever the schema says, and read it anew (an op writing in place or into ``out=`` just runs)."""
        read = set()
        for t in tree_leaves(inputs):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                ptr = t.untyped_storage().data_ptr()
                read.add(ptr)
                if ptr not in audit.made:
                    audit.used.setdefault(ptr, f"{op} {tuple(t.shape)}")
        results = [t for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]
        new = [(i, t) for i, t in enumerate(results) if t.untyped_storage().data_ptr() not in read]
        audit.made.update(t.untyped_storage().data_ptr() for _, t in new)
        if replay and capturing:
            capturing[-1].ops.append((run, new if fresh else []))

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.aten._local_scalar_dense.default:
                raise RuntimeError("a host sync (.item(), .tolist(), a tensor in an if) inside a CUDA graph capture: "
                                   "a GPU refuses it")
            if replay:  # a capture only records: memory it writes is put back when it ends
                for i, arg in enumerate(func._schema.arguments):
                    if arg.alias_info is not None and arg.alias_info.is_write:
                        value = args[i] if i < len(args) else kwargs.get(arg.name)
                        capturing[-1].saved += [(t, t.clone()) for t in tree_leaves(value) if isinstance(t, torch.Tensor)
                                                and t.untyped_storage().data_ptr() not in audit.made]
            out = func(*args, **kwargs)
            writes = any(r.alias_info is not None and r.alias_info.is_write for r in func._schema.returns)
            note(functools.partial(func, *args, **kwargs), (args, kwargs), out, str(func), fresh=not writes)
            return out

    real_flex = flex_module.flex_attention

    def audited_flex(query, key, value, *args, block_mask=None, **kwargs):
        # FlexAttention compiles itself, which no dispatch mode may watch: its tensors are noted here,
        # the block tables and whatever its mask function holds among them, and it runs unwatched.
        held = [] if block_mask is None else [*block_mask.as_tuple()[:-1]]
        for cell in getattr(getattr(block_mask, "mask_mod", None), "__closure__", None) or ():
            try:
                held.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue

        def run():
            with _disable_current_modes():
                return real_flex(query, key, value, *args, block_mask=block_mask, **kwargs)

        out = run()
        note(run, (query, key, value, held), out, "flex_attention")
        return out

    class Graph:
        def __init__(self, *args, **kwargs) -> None:
            self.ops: list = []
            self.saved: list = []  # (tensor, its content before the capture wrote it)

        def replay(self) -> None:
            for run, outs in self.ops:
                result = [t for t in tree_leaves(run()) if isinstance(t, torch.Tensor)]
                for i, old in outs:
                    old.copy_(result[i])

    class Stream:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def wait_stream(self, other) -> None:
            pass

    @contextlib.contextmanager
    def capture(graph, *args, **kwargs):
        capturing.append(graph)
        try:
            with Recorder(), mock.patch.object(flex_module, "flex_attention", audited_flex):
                yield
        finally:
            capturing.pop()
            # As on a GPU, where a capture runs nothing: what it wrote is as before, and what it made
            # holds no result until a replay (NaN, or -1 for integers).
            for t, before in reversed(graph.saved):
                t.copy_(before)
            graph.saved.clear()
            for _, outs in graph.ops:
                for _, t in outs:
                    if t.dtype != torch.bool:
                        t.fill_(float("nan") if t.is_floating_point() else -1)

    with mock.patch.multiple(torch.cuda, Stream=Stream, current_stream=lambda *a, **k: Stream(), CUDAGraph=Graph,
                             graph=capture, graph_pool_handle=lambda: None,
                             stream=lambda s: contextlib.nullcontext()):
        yield audit
