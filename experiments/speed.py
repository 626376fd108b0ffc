"""What one round costs on the GPU, per strategy and budget, eager and fast.

    python experiments/speed.py                                # Qwen3-8B geometry, random weights
    python experiments/speed.py geometry=qwen3-4b budgets=[16,64] rounds=16
    python experiments/speed.py 'prompt_lengths=[512,8192,32768,131072]' 'paths=[fast]' 'budgets=[64,256]' \
        check_tokens=0                                          # long context: one table, every length
    python experiments/speed.py target_path=assets/pair/target drafter_path=assets/pair/dflash \
        prompts=assets/pair/heldout_prompts.jsonl check_tokens=128   # trained weights: the bf16 check
    python experiments/speed.py target_path=... drafter_path=... prompts=... check_tokens=128 rounds=0  # the check alone

Strategies are presets of configs/experiment/ (``strategies``; a tree preset runs once per budget
of ``budgets``), composed as experiments/run.py composes them; AR is the engine with the null
drafter. For each
configuration: the mean round time (no per-stage synchronisation), the per-stage breakdown
(a second run that synchronises at every stage boundary), the memory peak, and the tokens/s and
speedup that a tau table implies (tau x t_AR / t_round; default: the paper's Qwen3-8B MATH-500
T=0 figures). A greedy check compares every strategy's tokens on every path with plain eager
AR in bf16 (``check_tokens`` tokens per prompt, on the ``prompts`` file's texts when given).
Random weights: acceptance is meaningless there, costs are real; near-ties in random logits
make bf16 paths part early, so the check means most on trained weights (``target_path=DIR``).

Each length of ``prompt_lengths`` gets its rows and its read floor: the target's weight bytes
plus the K/V bytes of that many rows, at the card's peak bandwidth (``ddtree.metrics.hardware.read_bandwidth``:
4.8 TB/s on an H200, 3.35 on an H100 SXM; ``read_bandwidth=TB/s`` sets it; what one step must at least read;
``x floor`` is the round over it). ``FLOP floor ms`` is what the row's verify must at least compute
at ``PEAK_FLOPS`` (``_compute_floor_ms``): past a few hundred nodes on a large target, or at long
context, it exceeds the read floor.
``attention`` is the fast target's and the DFlash drafter's (``auto``: from ``flex_threshold`` live
rows on, split attention where it serves, else FlexAttention; ``flex``: FlexAttention only, the
split's baseline); ``split_prefix`` picks the split's prefix kernel (``flash`` or ``triton``; null:
the library's choice, ``split_attention.triton_prefix_first``); ``fuse_projections`` (null: on with
CUDA graphs; true / false forces it) gives the fast target each layer's same-input projections as one
GEMM (``fused.fuse_projections``: an MLP's gate and up, a GDN layer's four input projections, an
attention layer's q, k and v);
``max_length: null`` sizes the caches for the longest prompt.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from ddtree import SpeculativeEngine, presets
from ddtree.drafters import DFlashDrafter
from ddtree.errors import reported, run_cli
from ddtree.metrics.hardware import read_bandwidth
from ddtree.presets import engine_from_config
from ddtree.testing import first_divergence, logit_gap
from ddtree.masks import DenseMaskCompiler
from ddtree.models import HFTarget, HybridTarget, gdn_tree_triton, split_attention
from ddtree.models.dispatch import is_hybrid
from ddtree.models.geometry import HYBRID, random_dflash_for, random_hybrid, random_qwen3
from ddtree.models.hybrid_static import StaticHybridTarget
from ddtree.models.static_target import StaticTarget
from ddtree.trees import ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier

PEAK_FLOPS = 989e12  # dense bf16 tensor-core FLOP/s of an H100 SXM and of an H200 (the same chip's compute)


def _time(engine: SpeculativeEngine, prompt: torch.Tensor, rounds: int, tail: int, stages: bool = True) -> dict:
    """Mean time of the first ``rounds`` rounds. The run goes ``tail`` tokens further, so those
    rounds have full-size drafts (near max_new_tokens drafts are cut, and shapes change). With
    ``stages`` a third, synchronised run gives the per-stage times of the same first rounds (each run
    prefills the prompt again: at 128K that is most of a row's time); without, the stages are NaN."""
    engine.timer_sync = False
    engine.generate(prompt, max_new_tokens=rounds + tail)  # warm-up: kernels, every graph size
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = engine.generate(prompt, max_new_tokens=rounds + tail)
    timed = min(rounds, len(result.round_ends))
    peak = torch.cuda.max_memory_allocated() - base
    if stages:
        engine.timer_sync = True
        staged = engine.generate(prompt, max_new_tokens=rounds + tail).round_stage_times[:rounds]
        per_stage = {k: 1e3 * sum(getattr(r, k) for r in staged) / max(len(staged), 1)
                     for k in vars(result.stage_times)}
    else:
        per_stage = dict.fromkeys(vars(result.stage_times), float("nan"))
    return {"round_ms": 1e3 * result.round_ends[timed - 1] / timed, "rounds": timed, "stages_ms": per_stage,
            "peak_extra_mib": peak / 2**20, "tokens": result.tokens}


@torch.inference_mode()
def _time_prefill(target: HFTarget, prompt: torch.Tensor, reps: int = 3) -> float:
    """Median ms of ``reps`` (at least one) ``target.prefill(prompt)`` after one warm-up (synchronised)."""
    reps, times = max(int(reps), 1), []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        target.prefill(prompt)
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - start))
    return sorted(times[1:])[reps // 2]


def _strategies(cfg: DictConfig, eager: HFTarget, fast: StaticTarget, dflash_model, mtp_head=None):
    """(label, path, engine) for every preset of ``cfg.strategies`` (configs/experiment/) on every
    path; a tree preset once per budget of ``cfg.budgets`` (label ``preset-B``). DFlash presets
    draft with ``dflash_model``, MTP presets with ``mtp_head`` (without one they are not built)."""
    paths = [(p, {"eager": eager, "fast": fast}[p]) for p in cfg.paths]
    heads = {} if mtp_head is None else {"head": mtp_head}
    shared = [f"mask={cfg.mask_name}"] if cfg.get("mask_name") else []  # e.g. mask=tree: no [n, context] mask buffer
    for preset in cfg.strategies:
        base = presets.compose(preset, shared)  # block_size null: the drafter's own
        budgets = list(cfg.budgets) if "budget" in base.tree else [None]
        # MTP: one row per k of ``mtp_steps`` (label -kK); unset, the preset's own steps.
        steps = list(cfg.mtp_steps) if cfg.get("mtp_steps") and "steps" in base.drafter else [None]
        for budget, k in ((b, k) for b in budgets for k in steps):
            overrides = shared + ([] if budget is None else [f"tree.budget={budget}", f"tree.method={cfg.tree_method}"]) \
                + ([] if k is None else [f"drafter.steps={k}"])
            strategy = presets.compose(preset, overrides) if overrides else base
            label = preset + ("" if budget is None else f"-{budget}") + ("" if k is None else f"-k{k}")
            for path, target in paths:
                # The eager rows build their trees op by op too (no CUDA graph for the heap's top-k).
                here = presets.compose(preset, overrides + ["tree.graphs=false"]) \
                    if path == "eager" and "graphs" in strategy.tree else strategy
                try:
                    engine = engine_from_config(here, target, model=dflash_model, max_length=cfg.max_length,
                                                cuda_graphs=path == "fast" and cfg.cuda_graphs,
                                                attention=cfg.get("attention", "auto") if path == "fast" else "dense",
                                                flex_threshold=cfg.get("flex_threshold", 4096),
                                                fuse=path == "fast" and bool(cfg.get("drafter_fuse", True)), **heads)
                except Exception as err:  # e.g. a preset whose drafter this run has no weights for
                    print(f"{label} {path}: not built: {type(err).__name__}: {str(err).splitlines()[0]}", flush=True)
                    continue
                yield label, path, engine


def _mtp_head(cfg: DictConfig, model):
    """An MTP head for the MTP presets: ``mtp_path``'s, else a random one (random targets only);
    None when no preset of ``cfg.strategies`` drafts with one."""
    from ddtree.models import MTPHead

    if not any("head" in presets.compose(p).drafter for p in cfg.strategies):
        return None
    if cfg.get("mtp_path"):
        weight = model.get_input_embeddings().weight
        return MTPHead.from_pretrained(cfg.mtp_path, dtype=weight.dtype, device=weight.device)
    return MTPHead.for_target(model) if cfg.target_path is None else None


def _models(cfg: DictConfig):
    """The target and drafter: trained ones from ``target``/``drafter`` paths, else random weights
    of a named geometry (``QWEN3`` or ``HYBRID`` of ``ddtree.models.geometry``)."""
    if cfg.target_path is None:
        model = random_hybrid(cfg.geometry) if cfg.geometry in HYBRID else \
            random_qwen3(cfg.geometry, max_positions=max(40960, cfg.max_length))
        return model, random_dflash_for(model, block_size=cfg.block_size), str(cfg.geometry)
    from ddtree.models.dflash import DFlashDraftModel
    from ddtree.models.hub import load_causal_lm

    if cfg.drafter_path is None:
        raise SystemExit("target_path=PATH needs drafter_path=PATH (a DFlash checkpoint made for that target)")
    model = load_causal_lm(cfg.target_path, dtype=torch.bfloat16, device_map="cuda").eval()
    dflash = DFlashDraftModel.from_pretrained(cfg.drafter_path, dtype=torch.bfloat16, device="cuda")
    return model, dflash, str(cfg.target_path)


def _check_prompts(cfg: DictConfig, fallback: torch.Tensor) -> list[torch.Tensor]:
    """Token ids of the ``prompts`` file's texts (tokenizer beside the target), each cut to the
    random prompt's length, or the random prompt."""
    if cfg.prompts is None:
        return [fallback]
    from ddtree.training.tokenizer import load_tokenizer

    tok = load_tokenizer(Path(cfg.target_path).parent / "tokenizer")
    texts = [json.loads(line)["text"] for line in Path(cfg.prompts).read_text().splitlines() if line.strip()]
    return [torch.tensor(tok.encode(t)[-fallback.numel():]) for t in texts[: cfg.check_prompts]]


@torch.inference_mode()
def _greedy_check(cfg: DictConfig, eager: HFTarget, fast: StaticTarget, dflash_model, prompts, mtp_head=None) -> dict:
    """Per strategy and path, per prompt: None where the tokens equal eager AR's, else the first
    differing token with the eager target's top-1/top-2 logit gap there. A divergence is a
    near-tie only when that gap is below ``cfg.near_tie_gap``; any other is a bug."""
    reference, result = {}, {}
    for name, path, engine in _strategies(cfg, eager, fast, dflash_model, mtp_head):
        parts = []
        for i, prompt in enumerate(prompts):
            tokens = engine.generate(prompt, max_new_tokens=cfg.check_tokens).tokens
            if name == "ar" and path == cfg.paths[0]:
                reference[i] = tokens
            at = first_divergence(reference[i], tokens)
            if at is None:
                parts.append(None)
                continue
            gap = logit_gap(eager.model, prompt, reference[i][:at])
            parts.append({"token": at, "gap": round(gap, 4), "near_tie": gap < cfg.near_tie_gap})
        result[f"{name}/{path}"] = parts
    return result


@torch.inference_mode()
def _drafter_graph_check(target, dflash_model, prompt, cfg, rounds: int = 8) -> dict:
    """The graphed drafter drafts what the eager one drafts, round after round."""
    eager = DFlashDrafter(dflash_model, target, max_length=cfg.max_length)
    graphed = DFlashDrafter(dflash_model, target, max_length=cfg.max_length, cuda_graphs=True)
    engine = SpeculativeEngine(target, eager, ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier())
    result = engine.generate(prompt, max_new_tokens=rounds * eager.block_size, record=True)
    graphed.reset(target.prefill(prompt))
    agree, worst = [], 0.0
    for record in result.rounds[:rounds]:
        draft = graphed.draft(record.tree.tokens[0].item())
        agree.append((draft.log_probs.argmax(-1).cpu() == record.draft.log_probs.argmax(-1).cpu()).float().mean().item())
        worst = max(worst, (draft.log_probs.exp() - record.draft.log_probs.exp()).abs().max().item())
        layout = DenseMaskCompiler().to(target.input_device, target.dtype).compile(record.tree, target.past_length)
        graphed.accept(record.verification, target.forward_tree(layout))
        target.commit(record.verification.path)
    return {"top1_agreement": sum(agree) / len(agree), "max_prob_diff": worst}


def _ratio(tau: float, ar: dict, path: str, row: dict) -> str:
    return f"{tau * ar[path] / row['round_ms']:.2f}" if path in ar else "n/a"


def _max_length(cfg: DictConfig) -> int:
    """``cfg.max_length``, or (null) the longest prompt plus what a run adds to it: the most new
    tokens of a timed run, a check or the drafter check, the largest verify and the drafter's
    block twice, rounded up to 128 rows."""
    if cfg.max_length is not None:
        return int(cfg.max_length)
    largest = max([int(b) for b in cfg.budgets] + [cfg.block_size]) + 1
    new = max(cfg.rounds + cfg.block_size, cfg.check_tokens, 8 * cfg.block_size)
    rows = max(cfg.prompt_lengths) + new + largest + 2 * cfg.block_size
    return -(-rows // 128) * 128


def _layers(model) -> tuple[object, list[str], int]:
    """The text config, each layer's kind ("full_attention" or, on a hybrid, "linear_attention") and the
    attention head dim: what both floors read."""
    c = model.config.get_text_config()
    kinds = list(getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers)
    return c, kinds, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def _read_floor_ms(model, length: int, bandwidth: float) -> float:
    """Weight bytes plus the K/V bytes of ``length`` rows (attention layers only) plus, on a hybrid, the
    float32 recurrent states of its GDN layers, read at ``bandwidth`` bytes/s, in ms."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    c, kinds, head_dim = _layers(model)
    element = next(model.parameters()).element_size()
    kv = 2 * kinds.count("full_attention") * c.num_key_value_heads * head_dim
    states = kinds.count("linear_attention") * 4 * (
        getattr(c, "linear_num_value_heads", 0) * getattr(c, "linear_key_head_dim", 0) * getattr(c, "linear_value_head_dim", 0))
    return 1e3 * (weights + kv * element * length + states) / bandwidth


def _verify_nodes(label: str, block_size: int) -> int | None:
    """Tokens one verify of a ``_strategies`` row holds: 1 for AR, the block for DFlash, B + 1 for a
    tree of budget B (label ``preset-B``), k + 1 for a k-step chain (``-kK``); None for others.

    >>> [_verify_nodes(x, 16) for x in ("ar", "dflash", "ddtree-64", "mtp-k3", "mtp_tree-16-k2", "oracle")]
    [1, 16, 65, 4, 17, None]
    """
    found = re.fullmatch(r"(?P<preset>[a-z_]+)(?:-(?P<budget>\d+))?(?:-k(?P<steps>\d+))?", label)
    if found is None:
        return None
    if found["budget"]:
        return int(found["budget"]) + 1
    if found["steps"]:
        return int(found["steps"]) + 1
    return {"ar": 1, "dflash": block_size}.get(found["preset"])


def _compute_floor_ms(model, length: int, nodes: int) -> float:
    """What one verify of ``nodes`` tokens after ``length`` committed ones must at least compute, at
    ``PEAK_FLOPS``, in ms: 2 FLOPs per weight of every linear layer (the LM head included, the
    embedding not) per token, plus, in each attention layer, 4 x query heads x head dim per query
    and key (scores and weighted values) over the ``length + nodes`` keys. A GDN layer's tree work is
    not counted. A round costs at least the larger of this and the read floor."""
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    c, kinds, head_dim = _layers(model)
    attention = 4 * kinds.count("full_attention") * c.num_attention_heads * head_dim * nodes * (length + nodes)
    return 1e3 * (2 * linear * nodes + attention) / PEAK_FLOPS


def _write(out: Path, cfg: DictConfig, rows: list[dict], checks: dict, prefill_ms: dict, table: str | None = None,
           partial: bool = False) -> None:
    """The run's JSON: rewritten after every row (``partial``), so a run stopped early keeps what it measured."""
    out.write_text(json.dumps({"config": OmegaConf.to_container(cfg), "rows": rows, "divergence": checks,
                               "prefill_ms": prefill_ms, "table": table, "partial": partial}, indent=1))


def _table(rows: list[dict], tau: dict, ar: dict) -> str:
    lines = ["| prompt | strategy | path | round ms | x floor | FLOP floor ms | draft | tree | layout | verify | commit | peak MiB | tau (given) | tok/s implied | x AR eager | x AR fast |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s, t = r["stages_ms"], tau.get(r["strategy"], 1.0)
        here = ar.get(r["prompt"], {})
        flops = r.get("compute_floor_ms")
        lines.append(
            f"| {r['prompt']} | {r['strategy']} | {r['path']} | {r['round_ms']:.2f} | {r['round_ms'] / r['floor_ms']:.2f} | "
            f"{'n/a' if flops is None else f'{flops:.2f}'} | "
            f"{s['draft']:.2f} | {s['tree']:.2f} | "
            f"{s['layout']:.2f} | {s['verify']:.2f} | {s['commit']:.2f} | {r['peak_extra_mib']:.0f} | {t:.2f} | "
            f"{1e3 * t / r['round_ms']:.0f} | {_ratio(t, here, 'eager', r)} | {_ratio(t, here, 'fast', r)} |"
        )
    return "\n".join(lines)


def _kernel_forms(cfg: DictConfig) -> None:
    """The kernel forms speed.yaml's ``split_block``, ``prefix_tile_256`` and ``gdn_push`` name (null keeps
    the library's): set on the modules for this process, checked first."""
    if cfg.get("prefix_tile_256") is not None:
        tile = tuple(int(x) for x in cfg.prefix_tile_256)
        if len(tile) not in (4, 5) or (len(tile) == 5 and (256 % tile[4] or tile[4] < 16)):
            raise SystemExit(f"prefix_tile_256={list(tile)}: give [BM, BN, warps, stages] or [BM, BN, warps, stages, "
                             "BC] with BC a power of two from 16 to 256")
        split_attention.PREFIX_TILES[256] = tile
    for key, module, name in (("split_block", split_attention, "FUSED_BLOCK"), ("gdn_push", gdn_tree_triton, "PUSH")):
        if cfg.get(key) is not None:
            if not isinstance(cfg[key], bool):
                raise SystemExit(f"{key}={cfg[key]!r}: choose true, false, or null (the library's choice)")
            setattr(module, name, cfg[key])


@hydra.main(config_path="../configs", config_name="speed", version_base=None)
@reported
def main(cfg: DictConfig) -> None:
    if not torch.cuda.is_available():
        raise SystemExit("experiments/speed.py measures GPU costs: no CUDA device is visible")
    torch.manual_seed(cfg.seed)
    OmegaConf.resolve(cfg)  # the JSON records the values (out, mask_name), not their ${hydra:...} sources
    start = time.perf_counter()
    if cfg.prompts is not None and cfg.target_path is None:
        raise SystemExit("prompts=FILE needs target_path=DIR: the prompts are tokenised with the tokenizer/ beside it")
    cfg.max_length = _max_length(cfg)
    if cfg.get("split_prefix") is not None:
        if cfg.split_prefix not in ("flash", "triton"):
            raise SystemExit(f"split_prefix={cfg.split_prefix!r}: choose flash, triton, or null (the library's choice)")
        split_attention.TRITON_PREFIX = cfg.split_prefix == "triton"
    _kernel_forms(cfg)
    model, dflash_model, name = _models(cfg)
    print(f"built {name} + drafter in {time.perf_counter() - start:.1f}s; caches of {cfg.max_length} rows", flush=True)
    fuse_projections = cfg.get("fuse_projections")  # None: on with CUDA graphs
    if is_hybrid(model):
        eager = HybridTarget(model)
        fast = StaticHybridTarget(model, cfg.max_length, cuda_graphs=cfg.cuda_graphs, attention=cfg.attention,
                                  flex_threshold=cfg.flex_threshold, triton=cfg.get("triton"),
                                  fuse_projections=fuse_projections)
        print(f"hybrid fast path kernels: {fast.kernels()}", flush=True)
    else:
        eager = HFTarget(model)
        fast = StaticTarget(model, max_length=cfg.max_length, cuda_graphs=cfg.cuda_graphs, attention=cfg.attention,
                            flex_threshold=cfg.flex_threshold, fuse_projections=fuse_projections)
    mtp_head = _mtp_head(cfg, model)
    rows, checks, floors, prefill_ms = [], {}, {}, {}
    bandwidth = read_bandwidth(torch.cuda.get_device_name(), cfg.get("read_bandwidth"))
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for length in cfg.prompt_lengths:
        prompt = torch.randint(0, model.config.get_text_config().vocab_size - 1, (length,))
        check_prompts = _check_prompts(cfg, prompt)
        prompt = check_prompts[0] if cfg.prompts is not None else prompt
        prefill_ms[length] = {path: _time_prefill({"eager": eager, "fast": fast}[path], prompt, cfg.prefill_reps)
                              for path in cfg.paths}
        print(f"prefill of {prompt.numel()} tokens, ms: {prefill_ms[length]}", flush=True)
        floors[length] = _read_floor_ms(model, length, bandwidth)
        for label, path, engine in _strategies(cfg, eager, fast, dflash_model, mtp_head) if cfg.rounds > 0 else ():
            try:
                nodes = _verify_nodes(label, dflash_model.config.block_size)
                row = {"prompt": length, "strategy": label, "path": path, "floor_ms": floors[length],
                       "read_bandwidth_tbs": bandwidth / 1e12,
                       "compute_floor_ms": None if nodes is None else _compute_floor_ms(model, length, nodes),
                       **_time(engine, prompt, cfg.rounds, dflash_model.config.block_size, cfg.stages)}
            except Exception as err:  # one failing path must not cost the whole table
                print(f"{length} {label} {path}: FAILED {type(err).__name__}: {err}", flush=True)
                continue
            row["new_tokens"] = len(row.pop("tokens"))
            rows.append(row)
            print(f"{length:7d} {label:12s} {path:5s} {row['round_ms']:8.2f} ms/round  "
                  f"(floor {floors[length]:.2f}, peak +{row['peak_extra_mib']:.0f} MiB)", flush=True)
            _write(out, cfg, rows, checks, prefill_ms, partial=True)  # a run cut short keeps every finished row
        if cfg.cuda_graphs and cfg.drafter_check:
            print("drafter graph vs eager:", _drafter_graph_check(eager, dflash_model, prompt, cfg), flush=True)
        if cfg.check_tokens:
            found = _greedy_check(cfg, eager, fast, dflash_model, check_prompts, mtp_head)
            checks.update({f"{length}/{k}": v for k, v in found.items()})
    ar: dict = {}
    for r in rows:
        if r["strategy"] == "ar":
            ar.setdefault(r["prompt"], {})[r["path"]] = r["round_ms"]
    tau = dict(OmegaConf.to_container(cfg.tau))
    table = _table(rows, tau, ar)
    print(f"\nfirst divergence from {cfg.paths[0]} AR greedy per prompt, {cfg.check_tokens} tokens, with the eager "
          f"top-1/top-2 logit gap there (None = identical; near-tie: gap < {cfg.near_tie_gap}): {json.dumps(checks)}")
    if is_hybrid(model):  # what ran, after the first verify compiled it (or fell back)
        print(f"hybrid fast path kernels: {fast.kernels()}", flush=True)
    print(f"\n{name}, prompts {list(cfg.prompt_lengths)}, {cfg.rounds} rounds, bf16, attention {cfg.attention}, "
          f"{torch.cuda.get_device_name()}; read floor (weights + K/V of the prompt at {bandwidth / 1e12:.2f} TB/s) "
          + ", ".join(f"{k}: {v:.2f} ms" for k, v in floors.items()) + "; peak MiB: above the memory held before the run; "
          f"prefill ms {prefill_ms}\n")
    print(table)
    identical = [k for k, v in checks.items() if all(d is None for d in v)]
    bugs = {k: [d for d in v if d is not None and not d["near_tie"]] for k, v in checks.items()}
    bugs = {k: v for k, v in bugs.items() if v}
    print(f"identical to eager AR on every prompt: {len(identical)} of {len(checks)}; "
          f"divergences that are not near-ties (gap >= {cfg.near_tie_gap}): {json.dumps(bugs) if bugs else 'none'}")
    _write(out, cfg, rows, checks, prefill_ms, table=table)
    if bugs:  # the figures are written; the exit status says the fast path is not exact
        raise SystemExit(f"fast path parts from eager AR where the eager logit gap is >= {cfg.near_tie_gap}: "
                         f"a bug, not a near-tie (see 'divergence' in {out})")


if __name__ == "__main__":
    run_cli(main)
