"""Strategies by name. The presets in ``configs/experiment/`` are the only definition of a
strategy (AR, MTP, DFlash, DDTree, and any preset you add there): this module composes them
with Hydra and builds the engines they describe, for Python users, notebooks and every entry
point in ``experiments/`` alike, so a strategy defined once runs everywhere. The parts never
read a config; this is the library's one module that imports Hydra.

    >>> import ddtree
    >>> engine = ddtree.load("ddtree", budget=64)           # the shipped pair, assets/pair   # doctest: +SKIP
    >>> result = engine.generate("def fibonacci(n):", max_new_tokens=64)                  # doctest: +SKIP
    >>> ddtree.presets.strategy_names()                                                   # doctest: +SKIP
    ['ar', 'ddtree', 'dflash', 'mtp']
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ddtree.engine import SpeculativeEngine
from ddtree.eval.build import build_engine, eos_stop_tokens
from ddtree.eval.runner import RunSettings
from ddtree.interfaces import Drafter, Target

REPO = Path(__file__).resolve().parents[1]
CONFIG_ENV = "DDTREE_CONFIGS"  # another configs/ folder (e.g. for a non-editable install)


def config_dir() -> Path:
    """The configs folder: ``$DDTREE_CONFIGS``, else ``configs/`` of this checkout."""
    folder = Path(os.environ.get(CONFIG_ENV) or REPO / "configs")
    if not (folder / "config.yaml").is_file():
        raise FileNotFoundError(
            f"no Hydra configs at {folder} (looked for config.yaml): install ddtree from its repository "
            f"(pip install -e .) or point {CONFIG_ENV} at its configs/ folder"
        )
    return folder


def register_resolvers() -> None:
    """``${repo_path:assets/pair}``: a path relative to the repository root, from any working directory."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver(
        "repo_path", lambda path: str(path if Path(path).is_absolute() else REPO / path), replace=True)
    OmegaConf.register_new_resolver("run_dirname", run_dirname, replace=True)


def run_dirname(overrides: str) -> str:
    """A run directory's name from its overrides (``hydra.job.override_dirname``): one flat,
    deterministic folder per config, so a rerun lands where the first run wrote."""
    name = overrides.replace("/", "_") or "defaults"
    if len(name) > 200:  # file systems cap a name at 255 bytes
        name = f"{name[:150]}-{hashlib.sha1(name.encode()).hexdigest()[:12]}"
    return name


def strategy_names() -> list[str]:
    """Every preset in ``configs/experiment/`` that defines a strategy (sets ``strategy:``)."""
    from omegaconf import OmegaConf

    names = []
    for file in sorted((config_dir() / "experiment").glob("*.yaml")):
        if OmegaConf.load(file).get("strategy") is not None:
            names.append(file.stem)
    return names


def compose(strategy: str | None = None, overrides: Sequence[str] = (), config_name: str = "config"):
    """The config ``experiments/run.py`` would see for ``experiment=strategy`` plus ``overrides``.

    >>> compose("ddtree", ["tree.budget=64"]).tree.budget      # doctest: +SKIP
    64
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ddtree.errors import one_line

    register_resolvers()
    overrides = list(overrides)
    if strategy is not None:
        if not (config_dir() / "experiment" / f"{strategy}.yaml").is_file():
            raise ValueError(f"unknown strategy {strategy!r}: the presets in {config_dir() / 'experiment'} are "
                             f"{', '.join(strategy_names())}; add a YAML there for a new one")
        overrides.insert(0, f"experiment={strategy}")
    try:
        if GlobalHydra.instance().is_initialized():  # inside a Hydra app: its config folder
            return hydra_compose(config_name, overrides=overrides)
        with initialize_config_dir(str(config_dir()), version_base="1.3"):
            return hydra_compose(config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:  # override and missing-config errors, in one line
        raise ValueError(f"cannot compose {config_name} with {' '.join(overrides)}: {one_line(err)}") from None


def config_error(err: BaseException, knob_advice: str | None = None) -> str:
    """A Hydra or OmegaConf error (composing, reading or instantiating a config) as a sentence
    naming the knob or config file and what to do (``ddtree.errors`` prints it on one line)."""
    from hydra.errors import ConfigCompositionException, InstantiationException, MissingConfigException, \
        OverrideParseException
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    from ddtree.errors import one_line

    text = str(err)
    if isinstance(err, OmegaConfBaseException):
        key = getattr(err, "full_key", None) or "a value"
        if isinstance(err, MissingMandatoryValue) or "Missing mandatory value" in text:
            return f"{key} is required and has no default: add {key}=VALUE to the command line"
        return f"{key}: {text.splitlines()[0]}"
    if isinstance(err, MissingConfigException):
        where = text.splitlines()[0].split(": ", 1)[-1]  # "Could not find 'experiment/nope'"
        options = f"; the options there: {', '.join(err.options)}" if err.options else ""
        return f"unknown config name: {where} in {config_dir()}{options}"
    if isinstance(err, OverrideParseException):
        lines = text.splitlines()
        return f"{lines[0]}: {lines[1] if len(lines) > 1 else ''}; write overrides as key=value (quote lists: 'key=[a,b]')"
    if isinstance(err, InstantiationException):
        knob = re.search(r"full_key: (\S+)", text)
        inner = one_line(err.__cause__) if err.__cause__ is not None else None
        return (f"{knob.group(1)}: " if knob else "") + (inner if inner is not None else text.splitlines()[0])
    if isinstance(err, ConfigCompositionException):
        key = re.search(r"Could not override '([^']+)'", text)
        if key and isinstance(err.__cause__, OmegaConfBaseException) and "not in struct" in str(err.__cause__):
            return _unknown_knob(key.group(1), knob_advice)
        cause = f" ({one_line(err.__cause__)})" if err.__cause__ is not None else ""
        return text.splitlines()[0] + cause
    return text.splitlines()[0] if text else type(err).__name__


def _unknown_knob(key: str, knob_advice: str | None) -> str:
    """``tree.budget`` on a config whose tree has no budget: which options of the group have it."""
    group, _, leaf = key.partition(".")
    folder = config_dir()
    having = [f.stem for f in sorted((folder / group).glob("*.yaml"))
              if leaf and re.search(rf"^{re.escape(leaf.split('.')[0])}:", f.read_text(), flags=re.M)]
    presets = [f.stem for f in sorted((folder / "experiment").glob("*.yaml"))
               if any(re.search(rf"override /{group}: {o}\b", f.read_text()) for o in having)]
    advice = ""
    if having:
        advice = f"; {group} configs that have it: {', '.join(having)} (choose one with {group}={having[0]}"
        advice += f", or a preset that does: experiment={presets[0]})" if presets else ")"
    return (f"{key} is not a knob of the {group} config chosen here (an override sets a knob, it cannot add one)"
            f"{advice}; {knob_advice or 'the flag --cfg job lists the knobs there are'}")


def _quoted(value: Any) -> str:
    text = str(value)
    return f"'{text}'" if any(c in text for c in " ,=[]{}()'\"") or text == "" else text


def load(strategy: str = "ddtree", target: Any = None, drafter: Any = None, tokenizer: Any = None, *,
         budget: int | None = None, temperature: float = 0.0, device: str | None = None,
         dtype: str | None = None, fast: bool | str | None = None, overrides: Sequence[str] = ()):
    """A ready ``SpeculativeEngine`` for a named strategy (a preset in ``configs/experiment/``).

    Args:
        strategy: ``ar``, ``mtp``, ``dflash``, ``ddtree`` or any other preset's name.
        target: None for the shipped pair; a pair directory (``target/``, ``dflash/``, ``mtp/``,
            ``tokenizer/``); a hub name or checkpoint directory; a loaded Transformers model; or
            a target adapter (``ddtree.models.HFTarget`` and kin). ``engine.target`` of an engine
            ``load`` built is reused as it is, with its drafters and tokenizer: engines for
            several strategies then share one loaded target.
        drafter: the drafter checkpoint (hub name or directory) when the target is not a pair; a
            loaded ``DFlashDraftModel``/``MTPHead``; or a ready ``Drafter``.
        tokenizer: defaults to the target's own when the target is given by name.
        budget: DDTree's node budget (tree strategies only).
        temperature: 0 decodes greedily; above 0 the output is distributed as the target's samples.
        overrides: any other Hydra overrides, e.g. ``["tree.draft_temperature=0.8"]``.

    The engine's ``tokenizer`` attribute holds the tokenizer (None if unknown); ``generate``
    then takes text as well as token ids.

    >>> engine = load("dflash", "Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", dtype="bfloat16", device="cuda")  # doctest: +SKIP
    >>> ar = load("ar", target=engine.target)                 # the same target, no second load  # doctest: +SKIP
    """
    ov, model = [], None
    if target is None or isinstance(target, (str, Path)):
        path = None if target is None else Path(str(target)).expanduser()
        if path is None or (path / "target" / "config.json").is_file():
            ov += ["target=pair"] + ([] if path is None else [f"target.dir={_quoted(path.resolve())}"])
        else:
            ov += ["target=hf", f"target.path={_quoted(target)}"]
    else:
        model = target
        ov += list(getattr(target, "preset_overrides", ()))  # a target load() built: its config again
    target_overrides = list(ov)
    network = {}
    if isinstance(drafter, (str, Path)):
        ov += [f"target.drafters.dflash={_quoted(drafter)}", f"target.drafters.mtp={_quoted(drafter)}"]
        drafter = None
    elif drafter is not None and not isinstance(drafter, Drafter):  # a loaded DFlashDraftModel or MTPHead
        network, drafter = {"model": drafter, "head": drafter}, None
    ov.append(f"temperature={temperature}")
    ov += [f"{k}={v}" for k, v in (("device", device), ("dtype", dtype), ("fast", fast)) if v is not None]
    ov += list(overrides)
    cfg = compose(strategy, ov)
    if budget is not None:
        if "budget" not in cfg.tree:
            raise ValueError(f"budget={budget} applies to tree strategies (ddtree); {strategy!r} verifies a chain")
        cfg.tree.budget = budget
    if model is None:
        check_files(cfg)
    if tokenizer is None and (model is None or hasattr(model, "preset_overrides")):
        from hydra.utils import instantiate

        tokenizer = instantiate(cfg.target.tokenizer)  # before the weights: a missing tokenizer fails at once
    built = _target(cfg, model)
    if model is None or hasattr(model, "preset_overrides"):
        built.preset_overrides = tuple(target_overrides)  # load(..., target=engine.target) shares it
    return engine_from_config(cfg, built, tokenizer=tokenizer, drafter=drafter, **network)


def check_files(*cfgs) -> None:
    """Cheap checks before any weights load: every local checkpoint directory that the configs'
    target and drafter name has readable safetensors headers (a truncated file fails naming it);
    each directory is read once, however many configs name it."""
    from omegaconf import OmegaConf

    from ddtree.models.loading import check_safetensors

    def paths(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("name_or_path", "path_or_name") and isinstance(value, str):
                    yield Path(value).expanduser()
                else:
                    yield from paths(value)
        elif isinstance(node, list):
            for value in node:
                yield from paths(value)

    nodes = [OmegaConf.to_container(node, resolve=True) for cfg in cfgs for node in (cfg.target.model, cfg.drafter)]
    for path in sorted({p for p in paths(nodes) if p.is_dir()}):
        check_safetensors(path)


def _target(cfg, model):
    """The target adapter: from the config, or around a given model, or the given adapter as is."""
    from hydra.utils import instantiate

    if model is None:
        return instantiate(cfg.target.model)
    if hasattr(model, "forward_tree"):
        return model
    from ddtree.models import target_for

    return target_for(model, fast=cfg.fast, fuse_projections=cfg.get("fuse_projections"))


def engine_from_config(cfg, target: Target, tokenizer=None, drafter: Drafter | None = None,
                       **drafter_kwargs) -> SpeculativeEngine:
    """The engine a composed strategy config describes (``ddtree.presets.compose``), on a loaded target.

    ``drafter``: a ready Drafter instead of ``cfg.drafter``. ``drafter_kwargs`` override arguments
    of a drafter built for a target (a ``_partial_`` config), where its signature takes them:
    ``model=`` a loaded ``DFlashDraftModel`` instead of the checkpoint the config names,
    ``head=`` a loaded ``MTPHead``, ``cuda_graphs=False``... Others are ignored, so one call
    serves every strategy, AR included. Stops on the tokenizer's eos when one is given; the
    engine keeps the tokenizer.
    """
    from hydra.utils import instantiate

    tree, mask, verifier = instantiate(cfg.tree), instantiate(cfg.mask), instantiate(cfg.verifier)
    if drafter is None:
        kwargs = _accepted(cfg.drafter._target_, drafter_kwargs) if cfg.drafter.get("_partial_") else {}
        drafter = instantiate(cfg.drafter, **kwargs)
    stop = eos_stop_tokens(tokenizer) if tokenizer is not None else ()
    return build_engine(target, drafter, tree, mask, verifier, stop_token_ids=stop, tokenizer=tokenizer)


def _identity(cfg, settings) -> dict:
    """What a finished run must share with this one to be reused (the prompts are added per set)."""
    from omegaconf import OmegaConf

    resolved = OmegaConf.to_container(cfg, resolve=True)
    return {**{k: resolved.get(k) for k in IDENTITY_KEYS},
            "max_new_tokens": settings.max_new_tokens, "max_prompt_tokens": settings.max_prompt_tokens,
            "accounting": settings.accounting.name}


def _accepted(path: str, kwargs: dict) -> dict:
    """The ``kwargs`` that the class or function at ``path`` takes."""
    from hydra.utils import get_method

    params = inspect.signature(get_method(path)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


# What defines a strategy's responses on one prompt set (run.json; a rerun must match it).
IDENTITY_KEYS = ("strategy", "target", "drafter", "tree", "mask", "verifier", "temperature", "block_size", "dtype",
                 "device", "fast", "seed")


def run_comparison(specs: Mapping[str, Sequence[str]], temperatures: Sequence[float], overrides: Sequence[str],
                   prompt_sets: Mapping[str, Any], out: Path, settings: RunSettings,
                   max_seconds: float = float("inf"), config_name: str = "config",
                   echo: Callable[[str], None] = print) -> dict[str, list[Row]]:
    """Every strategy of ``specs`` (name -> overrides: a preset and its knobs) at every temperature,
    composed on top of ``overrides`` (``config_name`` in configs/), over every prompt set (name ->
    a ``load_prompts`` config with ``_target_``, or a list of Prompts). Records go to
    ``out/<set>/<name>_T<t>/``; the time cap is shared out over the sets. Returns the table rows.
    """
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from ddtree.eval.compare import Contender, compare, format_table, table_rows

    start = time.perf_counter()
    # 1. The cheap parts first: the prompts are read, every strategy composes and builds its tree and
    #    verifier, and every checkpoint's header is read before any weights load.
    sets = {name: list(spec) if isinstance(spec, (list, tuple)) else instantiate(spec)
            for name, spec in prompt_sets.items()}
    configs = {(name, float(t)): compose(None, [*overrides, *spec, f"temperature={float(t)}"], config_name)
               for t in temperatures for name, spec in specs.items()}
    for c in configs.values():
        instantiate(c.tree), instantiate(c.verifier)
    check_files(*configs.values())
    targets = {OmegaConf.to_yaml(c.target, resolve=True) for c in configs.values()}
    if len(targets) > 1:
        raise ValueError("the strategies compose different targets; one comparison shares one target")
    # 2. One target and tokenizer for all; one engine per strategy and temperature.
    first = next(iter(configs.values()))
    tokenizer = instantiate(first.target.tokenizer)
    target = instantiate(first.target.model)
    engines = {key: engine_from_config(c, target, tokenizer=tokenizer) for key, c in configs.items()}
    identities = {key: _identity(c, settings) for key, c in configs.items()}
    echo(f"{first.target.name} as {type(target).__name__} on {target.input_device}; strategies {', '.join(specs)}; "
         f"T = {', '.join(f'{float(t):g}' for t in temperatures)}; {settings.max_new_tokens} new tokens; "
         f"threads {_threads()} of {os.cpu_count()} cores")
    # 3. Each set in turn, every strategy on every prompt.
    results = {}
    for i, (set_name, prompts) in enumerate(sets.items()):
        spec = prompt_sets[set_name]
        where = OmegaConf.to_container(spec, resolve=True) if OmegaConf.is_config(spec) else \
            [p.id for p in prompts] if isinstance(spec, (list, tuple)) else spec
        contenders = [Contender(name, c.strategy, t, engines[name, t], out / set_name / f"{name}_T{t:g}",
                                {**identities[name, t], "prompts": where},
                                {"model": first.target.name, "dataset": set_name})
                      for (name, t), c in configs.items()]
        share = (max_seconds - (time.perf_counter() - start)) / (len(sets) - i)
        summary = compare(contenders, tokenizer, prompts, settings, max_seconds=share, desc=set_name)
        rows = results[set_name] = table_rows(contenders)
        n = min((r.responses for r in rows), default=0)
        echo(f"\n{format_table(rows, f'{set_name}: {n} of {len(prompts)} prompts')}")
        if summary.cut_by_time:
            echo(f"time cap: {set_name} stopped after {summary.decoded} of {len(prompts)} prompts "
                 f"(its share of max_seconds={max_seconds:g}; raise it to decode them all)")
        reused = sum(s.reused for s in summary.per_contender.values())
        if reused:
            echo(f"{reused} responses were already recorded under {out / set_name} and reused (a resumed run); "
                 "delete that folder or pick another output folder to decode them again")
    return results


def _threads() -> int:
    import torch

    return torch.get_num_threads()
