"""The multi-token-prediction (MTP) head of Qwen3-Next / Qwen3.5 / Qwen3.6, and the same head for
targets that ship none (Qwen3, Llama), where it is trained and saved in the same ``mtp.*`` layout.

The head at position t reads the target's post-final-norm hidden ``h_t`` and the embedding of
the next token ``x_{t+1}`` and predicts ``x_{t+2}``:

    u  = fc(concat[norm_e(E[x_{t+1}]), norm_h(h_t)])    # embedding first: the order the weights expect
    u  = decoder_layer(u, position t)                     # one full-attention layer, its own KV cache
    h' = norm(u)                                          # logits = target.lm_head(h'); chained steps feed h'

The embedding and the LM head are the target's (Qwen ships no copy). The inner layer is the
target family's own transformers decoder layer, so checkpoint names match without conversion;
the norms are that family's too, which makes them zero-centred ``(1 + w)`` for Qwen3.5/Next.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn
from transformers import AttentionInterface, AutoConfig, DynamicCache, PretrainedConfig

from ddtree.models.attention import NAME as FOLDED_SDPA
from ddtree.models.attention import folded_sdpa
from ddtree.models.loading import resolve_checkpoint

# model_type -> (transformers module, class-name prefix, rotary class). One line per family.
FAMILIES: dict[str, tuple[str, str, str]] = {
    "qwen3": ("qwen3", "Qwen3", "Qwen3RotaryEmbedding"),
    "llama": ("llama", "Llama", "LlamaRotaryEmbedding"),
    "qwen3_5_text": ("qwen3_5", "Qwen3_5", "Qwen3_5TextRotaryEmbedding"),
    "qwen3_5_moe_text": ("qwen3_5_moe", "Qwen3_5Moe", "Qwen3_5MoeTextRotaryEmbedding"),
    "qwen3_next": ("qwen3_next", "Qwen3Next", "Qwen3NextRotaryEmbedding"),
}

# DeepSeek-V3 names of the same parts (its MTP layer sits at ``model.layers.{num_hidden_layers}``).
_DEEPSEEK_RENAMES = (("eh_proj.", "fc."), ("enorm.", "pre_fc_norm_embedding."),
                     ("hnorm.", "pre_fc_norm_hidden."), ("shared_head.norm.", "norm."))
_DEEPSEEK_LAYER_PARTS = ("self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm.")
_DEEPSEEK_SHARED_COPIES = ("embed_tokens.weight", "shared_head.head.weight")  # copies of the target's
_PER_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The decoder's config (``text_config`` of ``Qwen3_5ForConditionalGeneration``-style configs)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _family_classes(config: PretrainedConfig) -> tuple[type, type, type]:
    if config.model_type not in FAMILIES:
        raise NotImplementedError(
            f"no MTP head for model_type {config.model_type!r}; supported: {sorted(FAMILIES)} "
            "(add a line to ddtree.models.mtp.FAMILIES for another family)"
        )
    module, prefix, rotary = FAMILIES[config.model_type]
    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    return getattr(mod, f"{prefix}DecoderLayer"), getattr(mod, f"{prefix}RMSNorm"), getattr(mod, rotary)


def _layer_config(config: PretrainedConfig) -> PretrainedConfig:
    """The target's config rewritten for one full-attention layer numbered 0 (as vLLM/SGLang build it)."""
    layers = getattr(config, "mtp_num_hidden_layers", None) or getattr(config, "num_nextn_predict_layers", None) or 1
    if layers != 1:
        raise NotImplementedError(f"the config asks for {layers} MTP layers; only one is supported")
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = ["full_attention"]  # the MTP layer is full attention even on hybrid trunks
    if hasattr(cfg, "mlp_only_layers"):
        cfg.mlp_only_layers = []  # index 0 of the trunk says nothing about the MTP layer's MLP
    if hasattr(cfg, "first_k_dense_replace"):
        cfg.first_k_dense_replace = 0
    if getattr(cfg, "_attn_implementation", None) not in ("eager", "sdpa"):
        cfg._attn_implementation = "sdpa"  # the head's masks are dense 4-D
    if getattr(cfg, "_experts_implementation", "eager") is None:
        cfg._experts_implementation = "eager"  # set by PreTrainedModel, which the head is not
    return cfg


def causal_mask(n: int, past: int, dtype: torch.dtype, device: torch.device) -> Tensor:  # [1, 1, n, past + n]
    """Additive mask: query i (at position past + i) sees keys 0..past + i."""
    keys = torch.arange(past + n, device=device)
    hidden = keys[None, :] > (past + torch.arange(n, device=device))[:, None]
    return (hidden.to(dtype) * torch.finfo(dtype).min)[None, None]


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None):
    old = torch.get_default_dtype()
    if dtype is not None and dtype.is_floating_point:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


class MTPHead(nn.Module):
    """One MTP module in the Qwen3-Next / Qwen3.5 layout (``fc``, ``pre_fc_norm_*``, ``layers.0``, ``norm``).

    ``config`` is the target's (text) config; the head keeps it, and ``save_pretrained`` writes it.

    >>> head = MTPHead.for_target(tiny_target("qwen3"))                   # doctest: +SKIP
    >>> out = head(embeds, hidden, torch.arange(5)[None])  # [1, 5, H] each -> [1, 5, H]   # doctest: +SKIP
    """

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.config = text_config(config)
        layer_cls, norm_cls, rotary_cls = _family_classes(self.config)
        self.layer_config = _layer_config(self.config)
        size, eps = self.config.hidden_size, self.config.rms_norm_eps
        self.fc = nn.Linear(2 * size, size, bias=False)
        self.pre_fc_norm_embedding = norm_cls(size, eps=eps)
        self.pre_fc_norm_hidden = norm_cls(size, eps=eps)
        self.layers = nn.ModuleList([layer_cls(self.layer_config, 0)])
        self.norm = norm_cls(size, eps=eps)
        self.rotary_emb = rotary_cls(config=self.layer_config)  # buffers only: not in the state dict
        self._init_raw_parameters()
        # transformers 5.24 names the layer's cache argument ``cache``; 5.17, ``past_key_values``.
        params = inspect.signature(layer_cls.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def _init_raw_parameters(self) -> None:
        # Fused MoE experts are bare ``torch.empty`` parameters that only PreTrainedModel initialises.
        std = getattr(self.config, "initializer_range", 0.02)
        with torch.no_grad():
            for module in self.modules():
                if not isinstance(module, (nn.Linear, nn.Embedding)):
                    for param in module.parameters(recurse=False):
                        if param.ndim >= 2:
                            param.normal_(0.0, std)

    def _rope_positions(self, position_ids: Tensor) -> Tensor:
        # Text mRoPE (Qwen3.5) takes one stream per section; on text all three are the 1-D position.
        # transformers 5.24 broadcasts [B, n] itself, 5.17 needs [3, B, n].
        if hasattr(self.rotary_emb, "mrope_section"):
            return position_ids[None].expand(3, -1, -1)
        return position_ids

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def groups(self) -> int:
        """Query heads per K/V head of the inner layer."""
        return int(self.layer_config.num_attention_heads) // int(self.layer_config.num_key_value_heads)

    def use_folded_sdpa(self) -> None:
        """Attention by ``ddtree.models.attention.folded_sdpa``: a mask of ``groups * n`` rows folds
        the query heads sharing a K/V head into the query length, so no K/V copy is made; any
        other mask, or none, runs stock SDPA (the same math either way)."""
        AttentionInterface.register(FOLDED_SDPA, folded_sdpa)
        self.layer_config._attn_implementation = FOLDED_SDPA

    def forward(self, embeds: Tensor, hidden: Tensor, position_ids: Tensor, cache: DynamicCache | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        """``embeds`` of the next tokens and the target's ``hidden`` ``[B, n, H]`` -> normed output ``[B, n, H]``.

        ``position_ids`` ``[B, n]``; with a cache the new K/V are appended to it. Without a mask,
        ``n > 1`` rows get the causal mask after the cache's rows.
        """
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        if attention_mask is None and x.shape[1] > 1:
            past = cache.get_seq_length() if cache is not None else 0
            attention_mask = causal_mask(x.shape[1], past, x.dtype, x.device)
        out = self.layers[0](
            x, attention_mask=attention_mask, position_ids=position_ids,
            position_embeddings=self.rotary_emb(x, self._rope_positions(position_ids)), **{self._cache_kwarg: cache},
        )
        return self.norm(out[0] if isinstance(out, tuple) else out)

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def for_target(cls, target_model: nn.Module, seed: int = 0) -> "MTPHead":
        """A random-initialised head shaped for a transformers target model (its device and dtype)."""
        weight = target_model.get_input_embeddings().weight
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            head = cls(copy.deepcopy(text_config(target_model.config)))
        return head.to(weight.device, weight.dtype).eval()

    @classmethod
    def from_pretrained(cls, path_or_name: str | Path, dtype: torch.dtype | None = None,
                        device: torch.device | str = "cpu") -> "MTPHead":
        """The ``mtp.*`` tensors of a checkpoint (which transformers drops on load).

        Reads only the MTP tensors (following ``model.safetensors.index.json`` when sharded; from
        a hub, only config files and the shards holding MTP tensors are fetched).
        DeepSeek-V3 names (``eh_proj``, ``enorm``, ``hnorm``, ``shared_head``) map onto the same
        module. Every tensor must be consumed: a missing or extra key fails naming it.

        >>> head = MTPHead.from_pretrained("Qwen/Qwen3.6-27B", torch.bfloat16, "cuda")   # doctest: +SKIP
        """
        path = resolve_checkpoint(path_or_name, patterns=("*.json",))
        config = text_config(AutoConfig.from_pretrained(str(path)))
        prefix = f"model.layers.{config.num_hidden_layers}."  # where DeepSeek-V3 keeps its MTP layer
        state, sources = _read_mtp_tensors(_mtp_files(path_or_name, path, prefix), prefix, path)
        dtype = dtype or next(t.dtype for t in state.values() if t.is_floating_point())
        with torch.device(device), _default_dtype(dtype):
            head = cls(config)
        expected = head.state_dict()
        missing = sorted(f"mtp.{k}" for k in set(expected) - set(state))
        extra = sorted(sources[k] for k in set(state) - set(expected))  # as the checkpoint names them
        if missing or extra:
            raise ValueError(
                f"MTP weights in {path} do not match the {config.model_type} MTP module: "
                f"missing keys {missing}, unexpected keys {extra}"
            )
        for key, tensor in state.items():
            if tensor.shape != expected[key].shape:
                raise ValueError(f"MTP weight {sources[key]!r} in {path} has shape {tuple(tensor.shape)}, "
                                 f"the module expects {tuple(expected[key].shape)}")
        head.load_state_dict(state, strict=True)
        return head.to(device, dtype).eval()

    def save_pretrained(self, directory: str | Path) -> None:
        """``mtp.*`` tensors in ``model.safetensors`` plus the target's config.json (a head on its own)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file(self._checkpoint_tensors(), str(directory / "model.safetensors"), metadata={"format": "pt"})
        config = copy.deepcopy(self.config)
        if getattr(config, "mtp_num_hidden_layers", None) is None:
            config.mtp_num_hidden_layers = 1
        config.to_json_file(str(directory / "config.json"), use_diff=False)

    def save_into(self, checkpoint: str | Path) -> None:
        """Write the ``mtp.*`` tensors into a single-file transformers checkpoint of the target, as
        Qwen3.5/3.6 ship them (transformers skips them when it loads the model; ``from_pretrained``
        of that directory reads them). Replaces the MTP tensors the file already holds."""
        file, config_file = Path(checkpoint) / "model.safetensors", Path(checkpoint) / "config.json"
        if not file.is_file() or not config_file.is_file():
            raise FileNotFoundError(f"{checkpoint} is not a single-file checkpoint (config.json, model.safetensors)")
        with safe_open(str(file), framework="pt", device="cpu") as f:
            state = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("mtp.")}
        save_file({**state, **self._checkpoint_tensors()}, str(file), metadata={"format": "pt"})
        config = json.loads(config_file.read_text())
        config["mtp_num_hidden_layers"] = 1
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    def _checkpoint_tensors(self) -> dict[str, Tensor]:
        return {f"mtp.{k}": v.detach().cpu().contiguous() for k, v in self.state_dict().items()}


# -- checkpoint reading --------------------------------------------------------------------------
def _canonical(key: str, deepseek_prefix: str) -> str | None:
    """The module's name for a checkpoint key: ``None`` for non-MTP keys, ``""`` for shared copies."""
    if key.startswith("mtp."):
        name = key[len("mtp."):]
    elif key.startswith(deepseek_prefix):
        name = key[len(deepseek_prefix):]
        if name in _DEEPSEEK_SHARED_COPIES:
            return ""  # the target's embedding / LM head, stored again: shared, not loaded
        if name.startswith(_DEEPSEEK_LAYER_PARTS):
            name = "layers.0." + name
    else:
        return None
    for old, new in _DEEPSEEK_RENAMES:
        if name.startswith(old):
            name = new + name[len(old):]
    return name


def _fuse_experts(state: dict[str, Tensor], sources: dict[str, str]) -> None:
    """Per-expert ``experts.{e}.{gate,up,down}_proj`` -> transformers' fused ``gate_up_proj`` / ``down_proj``."""
    groups: dict[str, dict[tuple[int, str], Tensor]] = {}
    origin: dict[str, str] = {}  # fused name prefix -> the checkpoint's, for error messages
    for key in [k for k in state if _PER_EXPERT.match(k)]:
        match = _PER_EXPERT.match(key)
        groups.setdefault(match[1], {})[(int(match[2]), match[3])] = state.pop(key)
        origin[match[1]] = sources.pop(key).rsplit(".experts.", 1)[0] + ".experts.*"
    for prefix, parts in groups.items():
        n = 1 + max(e for e, _ in parts)
        try:
            gate_up = [torch.cat([parts[e, "gate"], parts[e, "up"]]) for e in range(n)]  # [2I, H] each
            state[f"{prefix}.gate_up_proj"] = torch.stack(gate_up)
            state[f"{prefix}.down_proj"] = torch.stack([parts[e, "down"] for e in range(n)])
        except KeyError as err:
            raise ValueError(f"MTP expert weights {origin[prefix]} are incomplete: no {err.args[0]}") from err
        sources[f"{prefix}.gate_up_proj"] = sources[f"{prefix}.down_proj"] = origin[prefix]


def _no_mtp(path: Path, prefix: str) -> ValueError:
    return ValueError(
        f"{path} holds no MTP weights (no 'mtp.*' or '{prefix}*' tensors): this model ships no MTP "
        "head; train one and save it with MTPHead.save_pretrained"
    )


def _mtp_files(path_or_name: str | Path, path: Path, prefix: str) -> list[Path]:
    """The safetensors files that hold MTP tensors (fetching just those when ``path`` is a hub snapshot)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted({f for k, f in weight_map.items() if _canonical(k, prefix) is not None})
        if not names:
            raise _no_mtp(path, prefix)
    else:
        names = [f.name for f in sorted(path.glob("*.safetensors"))] or ["*.safetensors"]
    if not all((path / name).is_file() for name in names):
        path = resolve_checkpoint(path_or_name, patterns=tuple(names))
    files = sorted(path.glob("*.safetensors")) if names == ["*.safetensors"] else [path / n for n in names]
    if not files:
        raise FileNotFoundError(f"{path} holds no *.safetensors file (other weight formats are not read)")
    return files


def _read_mtp_tensors(files: list[Path], prefix: str, path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Only the MTP tensors of these files, keyed by the module's names; and each one's checkpoint key."""
    state: dict[str, Tensor] = {}
    sources: dict[str, str] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                name = _canonical(key, prefix)
                if name:
                    state[name], sources[name] = f.get_tensor(key), key
    if not state:
        raise _no_mtp(path, prefix)
    _fuse_experts(state, sources)
    return state, sources


# -- a quick fit, for tests and examples on tiny targets ---------------------------------------
def _chain_mask(counts: list[int], dtype: torch.dtype, device: torch.device) -> Tensor:  # [1, 1, m, sum(counts)]
    """What step ``len(counts)`` sees at draft time, laid out over all steps' rows.

    Row (step j, origin s) is the j-th draft step after the pair at position s: it sees step 1's
    rows at origins <= s (the committed pairs and step 1 itself) and its own chain's steps 2..j.
    """
    origins = [torch.arange(c, device=device) for c in counts]
    query = origins[-1][:, None]
    allowed = torch.cat([origins[0][None] <= query] + [o[None] == query for o in origins[1:]], dim=1)
    return ((~allowed).to(dtype) * torch.finfo(dtype).min)[None, None]


def fit_to_target(head: MTPHead, model: nn.Module, sequences: Tensor | list[Tensor], steps: int = 300,
                  depth: int = 3, lr: float = 3e-3, temperature: float = 1.0) -> list[float]:
    """Distil ``head`` to the target ``model`` on token ``sequences`` ``[B, n]`` (or a list of ``[n_i]``).

    Each of ``depth`` chained steps is trained (KL to the target's next-token distribution)
    with the attention it has at draft time, fed the true next tokens: a few hundred Adam steps
    make a tiny head accept several tokens per round. ``temperature`` < 1 distils a sharpened
    target, which suits greedy decoding (the head learns the argmax, confidently, so trees can
    go deep). Returns the per-iteration losses. Not a training recipe for real models.

    >>> fit_to_target(head, model, torch.randint(0, 96, (16, 64)), steps=200)   # doctest: +SKIP
    """
    seqs = list(sequences)
    lengths = torch.tensor([s.numel() for s in seqs])  # [B]
    # Right padding is harmless under causal attention; padded rows are masked out of the loss.
    input_ids = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True).to(head.fc.weight.device)  # [B, n]
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=input_ids).last_hidden_state  # [B, n, H] post-norm
        target_logp = torch.log_softmax(model.get_output_embeddings()(hidden).float() / temperature, dim=-1)
        embeds = model.get_input_embeddings()(input_ids)  # [B, n, H]
    lm_head, n, device = model.get_output_embeddings(), input_ids.shape[1], input_ids.device
    optimizer = torch.optim.Adam(head.parameters(), lr=lr)
    head.train()
    losses = []
    for _ in range(steps):
        cache, h, loss = DynamicCache(), hidden[:, :-1], 0.0
        for j in range(1, min(depth, n - 1) + 1):
            m = n - j  # rows of step j: origins s = 0..m-1, position s + j - 1, predicting x_{s+j+1}
            mask = _chain_mask([n - 1 - i for i in range(j)], hidden.dtype, device)
            positions = (torch.arange(m, device=device) + j - 1)[None]
            h = head(embeds[:, j:], h[:, :m], positions, cache, attention_mask=mask)  # [B, m, H]
            logq = torch.log_softmax(lm_head(h).float(), dim=-1)  # [B, m, V]
            p_logp = target_logp[:, j:]  # the target's distribution of x_{s+j+1}, given x_0..x_{s+j}
            valid = (torch.arange(m) + j < lengths[:, None]).to(device)  # [B, m] inputs all real tokens
            kl = (p_logp.exp() * (p_logp - logq)).sum(-1)  # [B, m]
            loss = loss + (kl * valid).sum() / valid.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    head.eval()
    return losses
