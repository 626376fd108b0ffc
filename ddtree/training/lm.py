"""The small target language model: a Qwen3 decoder (or a Qwen3.5-layout Gated DeltaNet hybrid)
trained from scratch on a token stream.

Training samples random windows of the concatenated training documents (eos-separated), and
keeps the weights of the step with the lowest held-out loss: the corpus is small next to what
a model of this size could absorb, so past a point more steps only memorise it.

    >>> model = build_target(TargetSpec.tiny(vocab_size=300))
    >>> sum(p.numel() for p in model.parameters()) < 200_000
    True
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel, Qwen3_5TextConfig, Qwen3Config

from ddtree.training.loop import Budget, OptimConfig, TrainResult, autocast, train_loop


@dataclass(frozen=True)
class TargetSpec:
    """Architecture of the target (a Qwen3 config; defaults give about 12.5M parameters)."""

    vocab_size: int = 8192
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_hidden_layers: int = 6
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 2048
    rope_theta: float = 10_000.0
    tie_word_embeddings: bool = True  # halves the embedding bytes of a model this small

    @classmethod
    def tiny(cls, vocab_size: int) -> "TargetSpec":
        """A CPU-test size."""
        return cls(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024)

    def hf_config(self, eos_token_id: int, pad_token_id: int) -> PretrainedConfig:
        fields = asdict(self)
        rope = {"rope_type": "default", "rope_theta": fields.pop("rope_theta")}  # transformers 5 keeps RoPE here
        return Qwen3Config(**fields, rope_parameters=rope, use_sliding_window=False,
                           **_shared_settings(eos_token_id, pad_token_id))


@dataclass(frozen=True)
class HybridTargetSpec(TargetSpec):
    """A Qwen3.5/3.6-layout hybrid (``Qwen3_5ForCausalLM``): Gated DeltaNet layers, every
    ``full_attention_interval``-th layer full attention (Qwen3.6's 3:1 pattern at 4), gated
    attention with partial rotary as Qwen3.5 has it. Loads with the code that loads a real Qwen3.5."""

    full_attention_interval: int = 4
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 64
    linear_value_head_dim: int = 64
    linear_conv_kernel_dim: int = 4
    partial_rotary_factor: float = 0.25

    def hf_config(self, eos_token_id: int, pad_token_id: int) -> PretrainedConfig:
        fields = asdict(self)
        interval = fields.pop("full_attention_interval")
        rope = {"rope_type": "default", "rope_theta": fields.pop("rope_theta"),
                "partial_rotary_factor": fields.pop("partial_rotary_factor")}
        layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                       for i in range(self.num_hidden_layers)]
        return Qwen3_5TextConfig(**fields, layer_types=layer_types, rope_parameters=rope,
                                 **_shared_settings(eos_token_id, pad_token_id))


def _shared_settings(eos_token_id: int, pad_token_id: int) -> dict:
    """What every target architecture is built with besides its shape."""
    return {"rms_norm_eps": 1e-6, "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": eos_token_id,
            "pad_token_id": pad_token_id, "attn_implementation": "sdpa"}


def build_target(spec: TargetSpec, eos_token_id: int = 0, pad_token_id: int = 1, seed: int = 0) -> PreTrainedModel:
    """A freshly initialised causal LM of ``spec``'s architecture (float32; train under autocast,
    ship in bf16)."""
    config = spec.hf_config(eos_token_id, pad_token_id)
    with torch.random.fork_rng(devices=[]):  # seeded without disturbing the caller's RNG
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)


def token_stream(docs: list[list[int]], device: torch.device | str = "cpu") -> Tensor:
    """All documents' ids (each already ending in eos) as one ``[N]`` tensor."""
    return torch.tensor([t for doc in docs for t in doc], dtype=torch.long, device=device)


def sample_windows(stream: Tensor, batch: int, seq_len: int, generator: torch.Generator) -> Tensor:
    """``[batch, seq_len]`` windows at uniform random offsets (on the stream's device)."""
    if stream.numel() <= seq_len:
        raise ValueError(f"the token stream ({stream.numel()} tokens) is shorter than seq_len {seq_len}")
    starts = torch.randint(0, stream.numel() - seq_len, (batch, 1), generator=generator, device=stream.device)
    return stream[starts + torch.arange(seq_len, device=stream.device)]


@torch.no_grad()
def mean_nll(model, stream: Tensor, seq_len: int, batch: int = 32, max_tokens: int | None = None) -> float:
    """Mean next-token negative log-likelihood (nats) over consecutive ``seq_len`` windows.

    Each window is scored on its own (no carried context), the usual fixed-window perplexity.
    """
    device = model.get_input_embeddings().weight.device
    stream = stream[: max_tokens] if max_tokens else stream
    n_windows = max(1, stream.numel() // seq_len)
    windows = stream[: n_windows * seq_len].view(n_windows, -1).to(device)
    total, count = torch.zeros((), device=device, dtype=torch.float64), 0
    was_training = model.training
    model.eval()
    for i in range(0, n_windows, batch):
        x = windows[i : i + batch]
        with autocast(device):
            logits = model(input_ids=x).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        total += nll.double()
        count += x[:, 1:].numel()
    model.train(was_training)
    return float(total) / count


def perplexity(model, stream: Tensor, seq_len: int, batch: int = 32, max_tokens: int | None = None) -> float:
    return math.exp(mean_nll(model, stream, seq_len, batch, max_tokens))


@dataclass(frozen=True)
class LMTrainConfig:
    batch_size: int = 32
    seq_len: int = 512
    eval_every: int = 250
    eval_tokens: int = 65_536  # held-out tokens scored at each evaluation
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-3, weight_decay=0.1, min_lr_ratio=0.1))
    seed: int = 0


@dataclass
class LMResult:
    train: TrainResult
    best_step: int
    best_heldout_nll: float
    history: list[tuple[int, float]]  # (step, held-out nll) at each evaluation

    @property
    def best_perplexity(self) -> float:
        return math.exp(self.best_heldout_nll)


def train_target(model, train: Tensor, heldout: Tensor, cfg: LMTrainConfig, budget: Budget,
                 log: Callable[[str], None] | None = print) -> LMResult:
    """Train ``model`` in place on windows of ``train`` ``[N]``; keeps the best held-out weights.

    >>> m = build_target(TargetSpec.tiny(300))
    >>> s = torch.randint(3, 300, (4096,))
    >>> r = train_target(m, s, s, LMTrainConfig(batch_size=4, seq_len=32, eval_every=5), Budget(max_steps=10), log=None)
    >>> r.train.steps, r.best_step in (1, 5, 10)
    (10, True)
    """
    device = model.get_input_embeddings().weight.device
    train, heldout = train.to(device), heldout.to(device)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    best: dict = {"nll": float("inf"), "step": 0, "state": None}
    history: list[tuple[int, float]] = []
    model.train()

    def loss_fn(step: int) -> Tensor:
        x = sample_windows(train, cfg.batch_size, cfg.seq_len, generator)  # [B, S]
        with autocast(device):
            return model(input_ids=x, labels=x).loss

    def evaluate(step: int, loss: float) -> None:  # at step 1, every eval_every steps and the last
        nll = mean_nll(model, heldout, cfg.seq_len, max_tokens=cfg.eval_tokens)
        history.append((step, nll))
        if log:
            log(f"  held-out nll {nll:.4f} (ppl {math.exp(nll):.2f}) at step {step}")
        if nll < best["nll"]:
            best.update(nll=nll, step=step, state=copy.deepcopy(model.state_dict()))

    start = time.perf_counter()
    result = train_loop(model.parameters(), loss_fn, budget, cfg.optim, log_every=cfg.eval_every, log=log,
                        on_log=evaluate)
    model.load_state_dict(best["state"])
    model.eval()
    if log:
        log(f"  kept step {best['step']} (held-out ppl {math.exp(best['nll']):.2f}); {time.perf_counter() - start:.1f}s")
    return LMResult(result, best["step"], best["nll"], history)
