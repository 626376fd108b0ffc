"""Build the shipped pair from the corpus: tokenizer, target, regenerated data, DFlash, MTP, card.

Each stage reads its inputs from the work directory and writes its outputs there, ending with
a small ``stage_<name>.json`` record; a stage whose record exists is skipped, so an
interrupted run resumes where it stopped. Every stage is seeded and runs under a time budget
capped by the run's deadline, so the whole pipeline cannot overrun one device call. The stages
are built from ``ddtree.training``; the settings are ``configs/pipeline/shipped_pair.yaml``, read
by its Hydra app ``experiments/shipped_pair.py`` (whose ``load_config`` also serves Python callers).

    >>> run_pipeline(shipped_pair.load_config(["work=/tmp/pair", "pipeline/preset=smoke"]))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import transformers
from safetensors.torch import load_file, save_file

from ddtree import presets
from ddtree.training import corpus as corpus_lib
from ddtree.training import pair as pair_lib
from ddtree.training.dflash import DFlashTrainConfig, decode_tau, grow_dflash, new_dflash, train_dflash
from ddtree.training.lm import LMTrainConfig, TargetSpec, build_target, mean_nll, token_stream, train_target
from ddtree.training.loop import Budget, autocast
from ddtree.training.mtp import MTPTrainConfig, train_mtp
from ddtree.training.sequences import SequenceSet, prompt_windows, regenerate
from ddtree.training.tokenizer import encode_documents, load_tokenizer, train_tokenizer

STAGES = ("tokenizer", "target", "regenerate", "dflash", "mtp", "evaluate")
TEMPERATURES = (0.0, 1.0)  # the card's two columns
HELDOUT_GREEDY = "heldout_greedy.safetensors"  # the regenerate stage's greedy held-out continuations


@dataclass(frozen=True)
class PipelineConfig:
    """One run's settings (each one explained in configs/pipeline/shipped_pair.yaml)."""

    corpus: Path
    work: Path
    assets: Path | None
    device: str
    deadline_seconds: float
    stages: tuple[str, ...]
    seed: int
    continue_from: Path | None
    target_config: str  # the configs/target/ entry that loads a pair of this layout (evaluate stage)
    mtp_in_target: bool  # the MTP head's mtp.* tensors go into the target's checkpoint (Qwen3.5/3.6 style)
    vocab_size: int
    heldout_prompts: int
    target: TargetSpec
    lm: LMTrainConfig
    target_budget: Budget
    regen_prompts: int
    prompt_tokens: int
    new_tokens: int
    regen_batch: int
    temperatures: tuple[float, ...]
    docstring_fraction: float
    regen_seconds: float
    decode_tau_sequences: int
    block_size: int
    dflash_layers: int
    dflash_taps: int
    dflash_tap_layers: tuple[int, ...] | None
    dflash: DFlashTrainConfig
    dflash_budget: Budget
    mtp: MTPTrainConfig
    mtp_budget: Budget
    strategies: tuple[str, ...] | None  # names in configs/main.yaml's strategy_specs; None: all
    tau_new_tokens: int
    tau_seconds: float
    fast: bool | str

    def __post_init__(self) -> None:
        unknown = set(self.stages) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}; choose from {STAGES}")
        if not 0.0 <= self.docstring_fraction <= 1.0:
            raise ValueError(f"docstring_fraction is a share of the prompts, in [0, 1]; got {self.docstring_fraction}")
        if not self.temperatures or min(self.temperatures) < 0:
            raise ValueError(f"temperatures must be one or more numbers >= 0 (0 is greedy), got {self.temperatures}")

    @property
    def pair(self) -> Path:
        return self.work / "pair"

    def dtype(self) -> torch.dtype:
        """The shipped precision: bf16 (CPU runs keep float32, which CPU kernels prefer)."""
        return torch.bfloat16 if torch.device(self.device).type == "cuda" else torch.float32


class Run:
    """Shared state of one pipeline run: config, clock, log, and the corpus once read."""

    def __init__(self, cfg: PipelineConfig, log: Callable[[str], None]) -> None:
        self.cfg, self.log, self.start = cfg, log, time.perf_counter()
        self._docs: list[corpus_lib.Document] | None = None
        self._streams: dict[str, torch.Tensor] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def seconds(self, wanted: float, *later: str, overhead: float = 0.0) -> float:
        """``wanted`` seconds, cut so that the budgets of the ``later`` stages that will run, and
        ``overhead`` seconds of loading and saving, still fit before the deadline."""
        left = self.cfg.deadline_seconds - self.elapsed() - overhead - sum(self.stage_seconds(s) for s in later)
        return max(min(wanted, left), 5.0)

    def stage_seconds(self, name: str) -> float:
        """The time a stage still to run is given (0 when it is not configured or already done)."""
        cfg = self.cfg
        if name not in cfg.stages or (cfg.work / f"stage_{name}.json").is_file():
            return 0.0
        seconds = {"target": cfg.target_budget.max_seconds, "regenerate": cfg.regen_seconds,
                   "dflash": cfg.dflash_budget.max_seconds, "mtp": cfg.mtp_budget.max_seconds,
                   "evaluate": cfg.tau_seconds}.get(name, 0.0)
        return seconds if math.isfinite(seconds) else 0.0

    def docs(self) -> list[corpus_lib.Document]:
        if self._docs is None:
            self._docs = corpus_lib.read_corpus(self.cfg.corpus)
        return self._docs

    def stream(self, split: str) -> torch.Tensor:
        """The split's documents tokenised into one ``[N]`` stream (cached on disk)."""
        if split not in self._streams:
            file = self.cfg.work / f"tokens_{split}.safetensors"
            if file.is_file():
                self._streams[split] = load_file(str(file))["ids"]
            else:
                tok = load_tokenizer(self.cfg.pair / pair_lib.TOKENIZER)
                ids = token_stream(encode_documents(tok, corpus_lib.split_texts(self.docs(), split)))
                save_file({"ids": ids.contiguous()}, str(file))
                self._streams[split] = ids
        return self._streams[split]

    def target(self, dtype: torch.dtype | None = None):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(self.cfg.pair / pair_lib.TARGET), dtype=dtype or self.cfg.dtype(),
                                                     attn_implementation="sdpa", use_safetensors=True)
        return model.to(self.cfg.device).eval()


def environment(device: str) -> dict:
    """Where a stage ran: the device's name and the library versions."""
    name = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "CPU"
    return {"device": name, "torch": torch.__version__, "transformers": transformers.__version__}


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def stage_tokenizer(run: Run) -> dict:
    cfg, out = run.cfg, run.cfg.pair / pair_lib.TOKENIZER
    committed = cfg.assets / pair_lib.TOKENIZER if cfg.assets else None
    if committed is not None and (committed / "tokenizer.json").is_file():
        shutil.copytree(committed, out, dirs_exist_ok=True)
        source = str(committed)
    else:
        train_tokenizer(corpus_lib.split_texts(run.docs(), "train"), cfg.vocab_size).save_pretrained(str(out))
        source = "trained"
    prompts = cfg.assets / pair_lib.PROMPTS if cfg.assets else None
    if prompts is not None and prompts.is_file():
        shutil.copy(prompts, cfg.pair / pair_lib.PROMPTS)
    else:
        heldout = [d for d in run.docs() if d.split == "heldout"]
        pair_lib.write_prompts(corpus_lib.code_prefixes(heldout, cfg.heldout_prompts, seed=cfg.seed),
                               cfg.pair / pair_lib.PROMPTS)
    return {"vocab_size": len(load_tokenizer(out)), "source": source}


def stage_target(run: Run) -> dict:
    cfg = run.cfg
    tok = load_tokenizer(cfg.pair / pair_lib.TOKENIZER)
    spec = dataclasses.replace(cfg.target, vocab_size=len(tok))
    model = build_target(spec, tok.eos_token_id, tok.pad_token_id, seed=cfg.seed).to(cfg.device)
    seconds = run.seconds(cfg.target_budget.max_seconds, "regenerate", "dflash", "mtp", "evaluate", overhead=40)
    budget = dataclasses.replace(cfg.target_budget, max_seconds=seconds)
    run.log(f"  target: {type(model).__name__}, {_params(model) / 1e6:.2f}M parameters, {budget.max_seconds:.0f}s budget")
    result = train_target(model, run.stream("train"), run.stream("heldout"), cfg.lm, budget, log=run.log)
    model.to(cfg.dtype()).save_pretrained(str(cfg.pair / pair_lib.TARGET))
    return {"parameters": _params(model), "steps": result.train.steps, "seconds": result.train.seconds,
            "final_loss": result.train.losses[-1], "best_step": result.best_step, "seq_len": cfg.lm.seq_len,
            "batch_size": cfg.lm.batch_size, "layers": spec.num_hidden_layers, "hidden_size": spec.hidden_size,
            "architecture": architecture(model.config), "heldout_history": result.history}


def architecture(config) -> str:
    """The card's name for a target's architecture: "Qwen3", or "Qwen3.5 hybrid (6 GDN + 2 attention)"."""
    kinds = getattr(config, "layer_types", None) or []
    if "linear_attention" not in kinds:
        return "Qwen3"
    return f"Qwen3.5 hybrid ({kinds.count('linear_attention')} GDN + {kinds.count('full_attention')} attention)"


def regen_prompts(run: Run, tok) -> tuple[torch.Tensor, int]:
    """``[regen_prompts, prompt_tokens]`` prompts: random windows of the training stream and, for
    ``docstring_fraction`` of them, the tokens just before a function body (after its docstring),
    in a seeded random order. Returns the prompts and how many end at a docstring."""
    cfg = run.cfg
    rows = []
    if cfg.docstring_fraction > 0:
        train = [d for d in run.docs() if d.split == "train"]
        texts = corpus_lib.docstring_ends(train, round(cfg.regen_prompts * cfg.docstring_fraction), seed=cfg.seed)
        ids = [tok.encode(text)[-cfg.prompt_tokens :] for text in texts]
        rows = [row for row in ids if len(row) == cfg.prompt_tokens]
    windows = prompt_windows(run.stream("train"), cfg.regen_prompts - len(rows), cfg.prompt_tokens, seed=cfg.seed)
    prompts = torch.cat([windows, torch.tensor(rows, dtype=windows.dtype).reshape(-1, cfg.prompt_tokens)])
    order = torch.randperm(prompts.shape[0], generator=torch.Generator().manual_seed(cfg.seed))
    return prompts[order], len(rows)


def stage_regenerate(run: Run) -> dict:
    cfg = run.cfg
    model, tok = run.target(), load_tokenizer(cfg.pair / pair_lib.TOKENIZER)
    prompts, docstring = regen_prompts(run, tok)
    seconds = run.seconds(cfg.regen_seconds, "dflash", "mtp", "evaluate", overhead=25)
    # One short untimed batch first: the first generate on a device pays its one-time setup
    # (about 20 s on an H200), which would otherwise come out of the first temperature's share.
    regenerate(model, prompts[: cfg.regen_batch], 4, tok.eos_token_id, tok.pad_token_id, cfg.regen_batch, log=None)
    torch.manual_seed(cfg.seed)
    parts, counts, start = [], {}, time.perf_counter()
    chunks = list(zip(cfg.temperatures, prompts.chunk(len(cfg.temperatures))))
    for i, (temperature, chunk) in enumerate(chunks):
        share = (seconds - (time.perf_counter() - start)) / (len(chunks) - i)  # unused time carries over
        run.log(f"  temperature {temperature}: {chunk.shape[0]} prompts, {share:.0f}s")
        parts.append(regenerate(model, chunk, cfg.new_tokens, tok.eos_token_id, tok.pad_token_id, cfg.regen_batch,
                                temperature, max(share, 1.0), log=run.log))
        counts[str(temperature)] = counts.get(str(temperature), 0) + len(parts[-1])
    data = SequenceSet(torch.cat([p.ids for p in parts]), torch.cat([p.loss_mask for p in parts]))
    data.save(cfg.work / "regenerated.safetensors")
    if cfg.decode_tau_sequences > 0:  # the target's greedy text on held-out windows: decode_tau's yardstick
        windows = prompt_windows(run.stream("heldout"), cfg.decode_tau_sequences, cfg.prompt_tokens, seed=cfg.seed)
        regenerate(model, windows, cfg.tau_new_tokens, tok.eos_token_id, tok.pad_token_id, cfg.regen_batch,
                   log=None).save(cfg.work / HELDOUT_GREEDY)
    return {"sequences": len(data), "decode_tau_sequences": cfg.decode_tau_sequences,
            "prompt_tokens": cfg.prompt_tokens, "new_tokens": cfg.new_tokens,
            "temperatures": list(cfg.temperatures), "sequences_per_temperature": counts,
            "prompts": int(prompts.shape[0]), "docstring_prompts": docstring,
            "response_tokens": int(data.loss_mask.sum())}


def earlier_training(cfg: PipelineConfig, part: str) -> dict:
    """What ``cfg.continue_from``'s ``part`` ("dflash" or "mtp") was trained for, from its metrics."""
    metrics = pair_lib.read_json(cfg.continue_from / pair_lib.METRICS)
    record = metrics.get(part, {})
    earlier = record.get("continued_from", {})
    return {"path": str(cfg.continue_from), "steps": record.get("steps", 0) + earlier.get("steps", 0),
            "seconds": record.get("seconds", 0.0) + earlier.get("seconds", 0.0),
            "sequences": metrics.get("regenerate", {}).get("sequences", 0) + earlier.get("sequences", 0)}


def _continued(cfg: PipelineConfig, part: str) -> Path | None:
    """The checkpoint directory to continue ``part`` from, or None for fresh weights."""
    if cfg.continue_from is None:
        return None
    path = (pair_lib.mtp_location(cfg.continue_from) if part == pair_lib.MTP else None) or cfg.continue_from / part
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"continue_from={cfg.continue_from} has no {part}/ checkpoint to continue training")
    return path


def stage_dflash(run: Run) -> dict:
    from ddtree.models.dflash import DFlashDraftModel

    cfg = run.cfg
    model, tok = run.target(), load_tokenizer(cfg.pair / pair_lib.TOKENIZER)
    data = SequenceSet.load(cfg.work / "regenerated.safetensors")
    start = _continued(cfg, pair_lib.DFLASH)
    if start is None:
        drafter = new_dflash(model, tok.mask_token_id, cfg.block_size, cfg.dflash_layers, cfg.dflash_taps, cfg.seed,
                             cfg.dflash_tap_layers)
    else:
        drafter = DFlashDraftModel.from_pretrained(start).float()
        if drafter.config.block_size != cfg.block_size or drafter.config.hidden_size != model.config.hidden_size:
            raise ValueError(f"{start} was made for another target or block size; it cannot be continued here")
        layers = max(cfg.dflash_layers, drafter.config.num_hidden_layers)
        if layers > drafter.config.num_hidden_layers or cfg.dflash_tap_layers:
            run.log(f"  grown from {drafter.config.num_hidden_layers} layers, taps {list(drafter.config.target_layer_ids)}"
                    f" to {layers} layers, taps {list(cfg.dflash_tap_layers or drafter.config.target_layer_ids)}")
            drafter = grow_dflash(drafter, layers, cfg.dflash_tap_layers, cfg.seed)
    drafter = drafter.to(cfg.device, torch.float32)
    seconds = run.seconds(cfg.dflash_budget.max_seconds, "mtp", "evaluate", overhead=20)  # + decode tau
    budget = dataclasses.replace(cfg.dflash_budget, max_seconds=seconds)
    heldout = SequenceSet.load(cfg.work / HELDOUT_GREEDY) if (cfg.work / HELDOUT_GREEDY).is_file() else None
    before = held_out_decode_tau(run, drafter, model, heldout, "before training") if start is not None else None
    result = train_dflash(drafter, model, data, cfg.dflash, budget, log=run.log)
    after = held_out_decode_tau(run, drafter, model, heldout, "after training")
    drafter.to(cfg.dtype()).save_pretrained(cfg.pair / pair_lib.DFLASH)
    record = {"parameters": _params(drafter), "steps": result.steps, "seconds": result.seconds,
              **({} if after is None else {"heldout_decode_tau": after}),
              **({} if before is None else {"heldout_decode_tau_before": before}),
              "final_loss": result.losses[-1], "block_size": drafter.config.block_size,
              "layers": drafter.config.num_hidden_layers, "taps": list(drafter.config.target_layer_ids),
              "anchors": cfg.dflash.anchors}
    return record if start is None else {**record, "continued_from": earlier_training(cfg, "dflash")}


def held_out_decode_tau(run: Run, drafter, model, heldout: SequenceSet | None, when: str) -> float | None:
    """T = 0 chain-DFlash tau on the target's greedy held-out continuations (``decode_tau``), logged."""
    if heldout is None:
        return None
    with autocast(run.cfg.device):
        tau = decode_tau(drafter, model, heldout.to(run.cfg.device))
    run.log(f"  decode tau {when}: {tau:.2f} (T = 0, chain, {len(heldout)} held-out greedy continuations, "
            "teacher-forced rounds)")
    return tau


def stage_mtp(run: Run) -> dict:
    from ddtree.models.mtp import MTPHead

    cfg = run.cfg
    model = run.target()
    data = SequenceSet.load(cfg.work / "regenerated.safetensors")
    start = _continued(cfg, pair_lib.MTP)
    head = MTPHead.for_target(model, seed=cfg.seed) if start is None else MTPHead.from_pretrained(start)
    head = head.to(cfg.device, torch.float32)
    budget = dataclasses.replace(cfg.mtp_budget, max_seconds=run.seconds(cfg.mtp_budget.max_seconds, "evaluate", overhead=10))
    result = train_mtp(head, model, data, cfg.mtp, budget, log=run.log)
    head = head.to(cfg.dtype())
    if cfg.mtp_in_target:
        head.save_into(cfg.pair / pair_lib.TARGET)
    else:
        head.save_pretrained(cfg.pair / pair_lib.MTP)
    record = {"parameters": _params(head), "steps": result.steps, "seconds": result.seconds,
              "final_loss": result.losses[-1], "depth": cfg.mtp.depth, "in_target": cfg.mtp_in_target}
    return record if start is None else {**record, "continued_from": earlier_training(cfg, "mtp")}


def strategy_specs(names: Sequence[str] | None) -> dict[str, list[str]]:
    """The named strategies (all when None) from configs/main.yaml's ``strategy_specs``: the main
    job's list, so the card measures what the main job runs. Name -> overrides."""
    specs = presets.compose(None, [], "main").strategy_specs
    unknown = [n for n in names or () if n not in specs]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}: configs/main.yaml's strategy_specs has {', '.join(specs)}")
    return {name: list(specs[name]) for name in names or specs}


def stage_evaluate(run: Run) -> dict:
    from ddtree.data import Prompt
    from ddtree.eval.runner import RunSettings

    cfg = run.cfg
    nll = mean_nll(run.target(), run.stream("heldout"), cfg.lm.seq_len)
    run.log(f"  held-out perplexity {math.exp(nll):.2f}")
    out = cfg.work / "evaluate"
    shutil.rmtree(out, ignore_errors=True)  # responses of earlier drafters: this stage decodes afresh
    specs = strategy_specs(cfg.strategies)
    overrides = [f"target={cfg.target_config}", f"target.dir='{cfg.pair.resolve()}'", f"device={cfg.device}",
                 f"dtype={str(cfg.dtype()).removeprefix('torch.')}", f"fast={str(cfg.fast).lower()}"]
    # The rows load_prompts("jsonl", path=...) gives for this file, read without the datasets library.
    prompts = [Prompt(p["id"], "heldout", (p["text"],), i)
               for i, p in enumerate(pair_lib.read_prompts(cfg.pair / pair_lib.PROMPTS))]
    settings = RunSettings(max_new_tokens=cfg.tau_new_tokens, seed=cfg.seed, warmup_tokens=8, progress=False,
                           max_prompt_tokens=256)
    rows = presets.run_comparison(specs, TEMPERATURES, overrides, {"heldout": prompts}, out, settings,
                                  max_seconds=run.seconds(cfg.tau_seconds, overhead=5), config_name="main",
                                  echo=run.log)["heldout"]
    return {"heldout_perplexity": math.exp(nll), "tau": [dataclasses.asdict(r) for r in rows],
            "tau_setup": {"prompts": rows[0].responses, "max_new_tokens": cfg.tau_new_tokens,
                          "max_prompt_tokens": settings.max_prompt_tokens, "strategies": specs}}


STAGE_FUNCTIONS = {"tokenizer": stage_tokenizer, "target": stage_target, "regenerate": stage_regenerate,
                   "dflash": stage_dflash, "mtp": stage_mtp, "evaluate": stage_evaluate}


def run_pipeline(cfg: PipelineConfig, log: Callable[[str], None] = print) -> dict:
    """Run the configured stages (skipping finished ones); returns the pair's metrics."""
    cfg.pair.mkdir(parents=True, exist_ok=True)
    run = Run(cfg, log)
    torch.manual_seed(cfg.seed)
    for name in cfg.stages:
        record = cfg.work / f"stage_{name}.json"
        if record.is_file():
            log(f"[{name}] done before, skipped ({record})")
            continue
        log(f"[{name}] start at {run.elapsed():.1f}s")
        begin = time.perf_counter()
        out = STAGE_FUNCTIONS[name](run)
        out["stage_seconds"] = time.perf_counter() - begin
        out["environment"] = environment(cfg.device)
        pair_lib.write_json(out, record)
        log(f"[{name}] done in {out['stage_seconds']:.1f}s (total {run.elapsed():.1f}s)")
    return write_card(run)


def reuse_target(cfg: PipelineConfig, source: Path) -> None:
    """Start ``cfg.work`` from a finished pair's tokenizer, prompts and target, with their records,
    so that a run retrains only the later stages (the drafters) for that same target."""
    metrics = pair_lib.read_json(source / pair_lib.METRICS)
    if not (source / pair_lib.TARGET / "config.json").is_file() or "target" not in metrics:
        raise FileNotFoundError(f"{source} holds no finished pair (target/ and metrics.json) to reuse")
    for part in (pair_lib.TOKENIZER, pair_lib.TARGET):
        shutil.copytree(source / part, cfg.pair / part, dirs_exist_ok=True)
    shutil.copy(source / pair_lib.PROMPTS, cfg.pair / pair_lib.PROMPTS)
    env = metrics.get("environment", {})
    target = {k: v for k, v in metrics["target"].items() if k != "heldout_perplexity"}
    pair_lib.write_json({"environment": env, **metrics.get("tokenizer", {})}, cfg.work / "stage_tokenizer.json")
    pair_lib.write_json({"environment": env, **target, "reused_from": str(source)}, cfg.work / "stage_target.json")


def write_card(run: Run) -> dict:
    """Gather the stage records into metrics.json and render README.md from it."""
    cfg = run.cfg
    rec = {name: pair_lib.read_json(cfg.work / f"stage_{name}.json") for name in STAGES}
    docs = run.docs()
    meta = pair_lib.read_json(corpus_lib.meta_path(cfg.corpus))
    metrics = {
        "corpus": {"source": meta.get("source", str(cfg.corpus.name)),
                   "train_files": sum(d.split == "train" for d in docs),
                   "heldout_files": sum(d.split == "heldout" for d in docs),
                   "train_tokens": int(run.stream("train").numel()), "heldout_tokens": int(run.stream("heldout").numel()),
                   "heldout_modules": [d.module for d in docs if d.split == "heldout"]},
        "tokenizer": rec["tokenizer"],
        "target": {**rec["target"], "heldout_perplexity": rec["evaluate"].get("heldout_perplexity")},
        "regenerate": rec["regenerate"], "dflash": rec["dflash"], "mtp": rec["mtp"],
        "tau": rec["evaluate"].get("tau", []), "tau_setup": rec["evaluate"].get("tau_setup", {}),
        "weight_megabytes": pair_lib.weight_bytes(cfg.pair) / 1e6,
        "weight_dtype": pair_lib.weight_dtype(cfg.pair),
        "wall_seconds": sum(r.get("stage_seconds", 0.0) for r in rec.values()),
        "train_seconds": sum(r.get("stage_seconds", 0.0) for name, r in rec.items() if name != "evaluate"),
        "evaluate_seconds": rec["evaluate"].get("stage_seconds"),
        "environment": rec["target"].get("environment") or environment(cfg.device),
        "evaluate_environment": rec["evaluate"].get("environment") or environment(cfg.device),
    }
    pair_lib.write_json(metrics, cfg.pair / pair_lib.METRICS)
    (cfg.pair / pair_lib.CARD).write_text(pair_lib.render_card(metrics))
    return metrics
