"""Ablation files: one's own ablation in YAML or TOML, run exactly as a built-in, and the
definition every sweep stores beside its runs.

``python -m ablations run my_kl.yaml`` reads the file (`load_ablation_file`), checks every
field before any run starts, registers the ablation (`ablations.registry.register`, as the
built-ins are) and sweeps it. A file::

    name: my_kl                        # a plain name: the sweep's folder for it
    question: Does the KL estimator matter at beta 0.04?
    preset: grpo                       # every variant's preset (a variant may name its own)
    testbed: true                      # scale the preset for the CPU testbed (default true)
    base: k3                           # the variant the others are paired with (default: the first)
    metric: final_sampled_accuracy     # a results.csv column or a metrics.jsonl key
    extra_metrics: [kl_k1, entropy]    # secondary quantities: reported and paired too
    seeds: 3                           # when the command gives no --seeds (default 3)
    steps: 20                          # RL steps per run (default: the preset's)
    overrides: {kl_coef: 0.04}         # PPOConfig fields set in every variant, under its own
    variants:                          # name: the PPOConfig fields it sets
      k3: {kl_estimator: k3}
      k1: {kl_estimator: k1}
    grid:                              # every combination: 3 x 2 variants, each named from its
      kl_coef: [0.0, 0.01, 0.05]       # values in axis order ("0.01-k3"); a list of such
      kl_estimator: [k1, k3]           # mappings gives several grids
    claims:                            # registered before the runs: ``claims DIR`` tests them
      - claim: k1 lets the policy drift further from the reference than k3.
        first: k1                      # variant
        second: k3                     # variant (default: the base)
        quantity: kl_k1                # a results.csv column, the metric or an extra metric
        direction: larger              # larger, smaller, or equal (then `margin` may be given)
        seeds: [1, 2, 3]               # default: 1 .. seeds
        effect: 0.1                    # optional: the size the test must see (python -m ablations power)
        effect_basis: stated           # optional: where that size comes from
        seeds_basis: pilot sd 0.05     # optional: why these seeds (python -m ablations power's answer)

``variants`` or ``grid`` (or both) must give at least two variants. A variant's fields may
include ``preset``; ``seed``, ``output_dir`` and ``progress`` belong to the sweep and
``total_steps`` to ``steps``. An unknown field anywhere is refused with the closest known
name; a value a `PPOConfig` refuses is refused naming the variant.

The sweep stores each ablation's definition, in this same format, as
``SWEEP_DIR/<ablation>/ablation.yaml`` (`store_definitions`): the report, ``claims`` and a
resumed sweep read the base, metric, variants and claims from there, so a report never
pairs against another base or measures another metric than the sweep was run with. A sweep
refuses to go on in a directory whose stored definition disagrees with the one given (base,
metric, testbed, or a variant's settings); new variants are added to it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import tomllib
from pathlib import Path
from typing import Any, Iterable

import yaml

from ppo.config import PRESETS, RENAMED_FIELDS, field_help
from ppo.settings.suggest import did_you_mean

from . import registry
from .sweep_plan import DEFAULT_SEEDS
from .registry import Ablation, Variant

FILE_SUFFIXES = (".yaml", ".yml", ".toml")
DEFINITION_FILE = "ablation.yaml"  # SWEEP_DIR/<ablation>/ablation.yaml

FIELDS = ("name", "question", "preset", "testbed", "base", "metric", "extra_metrics", "seeds", "steps",
          "overrides", "variants", "grid", "claims")
CLAIM_FIELDS = ("claim", "first", "second", "quantity", "direction", "margin", "seeds", "source", "family", "effect",
                "effect_basis", "seeds_basis")
DIRECTIONS = {"larger": 1, "smaller": -1, "equal": 0, 1: 1, -1: -1, 0: 0}
# Config fields the sweep sets for every run: a variant setting them would be overwritten.
SWEEP_FIELDS = {"seed": "the sweep gives every run its seed (1 .. seeds)",
                "output_dir": "the sweep gives every run its directory",
                "progress": "the sweep turns progress bars off",
                "total_steps": "set `steps` for the ablation instead"}
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=,-]*")
METRIC_NAME = re.compile(r"[A-Za-z0-9_.:-]+")


class AblationFileError(ValueError):
    """An ablation file (or a stored definition) that cannot be used; the message names the file."""


def is_ablation_file(name: str) -> bool:
    """Whether a ``run`` argument names an ablation file rather than a registered ablation."""
    return Path(name).suffix.lower() in FILE_SUFFIXES


# ==========================================================================================
# Reading
# ==========================================================================================
def read_mapping(path: str | Path) -> dict:
    """The file's top-level mapping: YAML (a key set twice is refused) or TOML, by suffix."""
    path = Path(path)
    if not path.is_file():
        raise AblationFileError(f"{path}: no such ablation file" if not path.exists()
                                else f"{path}: not a file")
    if path.suffix.lower() == ".toml":
        try:
            return tomllib.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as error:
            raise AblationFileError(f"{path}: not UTF-8 text (byte {error.start})") from None
        except tomllib.TOMLDecodeError as error:
            raise AblationFileError(f"{path}: not valid TOML ({error})") from None
    from ppo.run.run_dir import read_config_file

    try:
        return read_config_file(path)
    except (ValueError, FileNotFoundError) as error:
        message = str(error).replace("a config file must hold a mapping of field: value",
                                     "an ablation file must hold a mapping (name:, question:, variants: ...)")
        raise AblationFileError(message) from None


def load_ablation_file(path: str | Path) -> Ablation:
    """Read, check and register the ablation of `path` (the same file twice: registered once).

    Raises `AblationFileError` naming the file and the field for anything it cannot use,
    before any run starts.
    """
    path = Path(path)
    kwargs = parse_definition(read_mapping(path), source=str(path))
    name = kwargs["name"]
    existing = registry.ABLATIONS.get(name)
    if existing is not None:
        if existing == Ablation(**kwargs):  # the same definition (a file named twice)
            return existing
        raise AblationFileError(f"{path}: name {name!r} is already taken by a registered ablation "
                                "(python -m ablations list); give this one another name")
    try:
        return registry.register(**kwargs)
    except ValueError as error:
        raise AblationFileError(f"{path}: {error}") from None


def parse_definition(data: Any, source: str, strict: bool = True) -> dict:
    """The `register` keywords an ablation file's mapping stands for; every field checked.

    `strict` also checks each variant's fields and builds its `PPOConfig` (values the config
    refuses are errors). A stored definition is read without it: it may come from an
    `Ablation` built in code (whose variants may set any field) or from an older version of
    the config, and the report still reads it.
    """
    def fail(message: str) -> AblationFileError:
        return AblationFileError(f"{source}: {message}")

    if not isinstance(data, dict):
        raise fail("an ablation file must hold a mapping (name:, question:, variants: ...)")
    _refuse_unknown(data, FIELDS, "field", fail)
    name = _plain_name(data.get("name"), "name", fail)
    question = data.get("question")
    if not isinstance(question, str) or not question.strip():
        raise fail("question: the question the ablation answers, as text (required)")
    testbed = data.get("testbed", True)
    if not isinstance(testbed, bool):
        raise fail(f"testbed: true or false (got {testbed!r})")
    steps, seeds = (_positive_int(data.get(key), key, fail) for key in ("steps", "seeds"))
    metric = data.get("metric")
    if not isinstance(metric, str) or not METRIC_NAME.fullmatch(metric):
        raise fail(f"metric: the results.csv column or metrics.jsonl key the question is about (got {metric!r})")
    extra = data.get("extra_metrics", [])
    if isinstance(extra, str):
        extra = [extra]
    if not isinstance(extra, list) or not all(isinstance(m, str) and METRIC_NAME.fullmatch(m) for m in extra):
        raise fail(f"extra_metrics: a list of metric names (got {extra!r})")

    default_preset = data.get("preset")
    if default_preset is not None:
        _preset_name(default_preset, "preset", fail)
    common = data.get("overrides", {})
    if not isinstance(common, dict):
        raise fail(f"overrides: a mapping of PPOConfig field: value (got {common!r})")
    check = _check_fields if strict else (lambda *args, **kwargs: None)
    check(common, "overrides", fail, allow_preset=False)
    variants = _variants(data.get("variants"), default_preset, common, fail, check)
    variants += _grid_variants(data.get("grid"), default_preset, common, fail, check)
    if len(variants) < (2 if strict else 1):  # a stored registry ablation may have one arm
        raise fail("an ablation compares at least two variants: give them under `variants:` or `grid:`")
    names = [v.name for v in variants]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise fail(f"variant name(s) {', '.join(map(repr, repeated))} given twice (grid cells are named from "
                   "their values: rename the variant)")
    base = data.get("base", names[0])
    if base not in names:
        raise fail(f"base: no variant {base!r}{did_you_mean(str(base), names)}; variants: {', '.join(names)}")
    variants.sort(key=lambda v: v.name != base)  # the base first: the registry's convention
    kwargs = dict(name=name, question=question.strip(), variants=tuple(variants), metric=metric,
                  extra_metrics=tuple(extra), steps=steps, testbed=testbed, seeds=seeds)
    kwargs["claims"] = _claims(data.get("claims"), kwargs, fail)
    if strict:
        ablation = Ablation(**kwargs)
        for variant in variants:
            try:
                ablation.config(variant, seed=1, output_dir="unused")
            except (ValueError, TypeError) as error:
                raise fail(f"variant {variant.name!r}: {error}") from None
    return kwargs


def _refuse_unknown(mapping: dict, known: Iterable[str], what: str, fail, where: str = "") -> None:
    known = list(known)
    for key in mapping:
        if key not in known:
            raise fail(f"{where}unknown {what} {key!r}{did_you_mean(str(key), known)}; known: {', '.join(known)}")


def _plain_name(value: Any, field: str, fail) -> str:
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise fail(f"{field}: a plain name (letters, digits, _ . - + = ,) is required (got {value!r})")
    text = str(value)
    if not PLAIN_NAME.fullmatch(text) or ".." in text:
        raise fail(f"{field}: {text!r} is not a plain name: letters, digits and _ . - + = , only, not starting "
                   "with . or -, no '..' (it names a folder of the sweep)")
    return text


def _positive_int(value: Any, field: str, fail) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise fail(f"{field}: a positive integer (got {value!r})")
    return value


def _preset_name(value: Any, field: str, fail) -> str:
    if value not in PRESETS:
        raise fail(f"{field}: unknown preset {value!r}{did_you_mean(str(value), PRESETS)}; presets: "
                   f"{', '.join(sorted(PRESETS))}")
    return value


def _check_fields(overrides: dict, where: str, fail, allow_preset: bool = True) -> None:
    """Every key a PPOConfig field (or `preset`), none of the sweep's own."""
    known = list(field_help()) + list(RENAMED_FIELDS) + (["preset", "seed_offset"] if allow_preset else [])
    for key in overrides:
        if key in SWEEP_FIELDS:
            raise fail(f"{where}: {key!r} cannot be set here: {SWEEP_FIELDS[key]}")
        if key not in known:
            raise fail(f"{where}: unknown PPOConfig field {key!r}{did_you_mean(str(key), known)} "
                       "(ppo-train --help lists every field)")


def _variant(name: str, settings: Any, default_preset: str | None, common: dict, where: str, fail,
             check) -> Variant:
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise fail(f"{where}: a mapping of PPOConfig field: value (got {settings!r})")
    check(settings, where, fail)
    overrides = {**common, **settings}
    chosen = overrides.pop("preset", default_preset)
    if chosen is None:
        raise fail(f"{where}: no preset: give `preset:` for the ablation or for this variant")
    # seed_offset: the arm trains on seed k + offset while paired with seed k (an A/A arm)
    offset = overrides.pop("seed_offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise fail(f"{where}: seed_offset: a non-negative integer (got {offset!r})")
    return Variant(name, _preset_name(chosen, f"{where}: preset", fail), overrides, seed_offset=offset)


def _variants(section: Any, default_preset: str | None, common: dict, fail, check) -> list[Variant]:
    if section is None:
        return []
    if not isinstance(section, dict):
        raise fail("variants: a mapping of variant name: {field: value, ...}")
    return [_variant(_plain_name(name, f"variants: {name!r}", fail), settings, default_preset, common,
                     f"variants.{name}", fail, check) for name, settings in section.items()]


def _value_name(value: Any) -> str:
    """A grid value as it appears in a cell's name: 0.01, 1e-05, true, none, k3."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value)) if value != 0 or math.copysign(1, value) > 0 else "0"
    return str(value)


def _grid_variants(section: Any, default_preset: str | None, common: dict, fail, check) -> list[Variant]:
    """Every cell of each grid (a mapping field: [values]), named from its values in axis order."""
    if section is None:
        return []
    grids = section if isinstance(section, list) else [section]
    variants = []
    for number, grid in enumerate(grids, start=1):
        where = "grid" if len(grids) == 1 else f"grid {number}"
        if not isinstance(grid, dict) or not grid:
            raise fail(f"{where}: a mapping of PPOConfig field: [values] (e.g. kl_coef: [0.0, 0.05])")
        check(grid, where, fail)
        for field, values in grid.items():
            if not isinstance(values, list) or not values:
                raise fail(f"{where}.{field}: a non-empty list of values (got {values!r})")
        for cell in itertools.product(*grid.values()):
            name = "-".join(_value_name(v) for v in cell)
            if not PLAIN_NAME.fullmatch(name) or ".." in name:
                raise fail(f"{where}: the cell {dict(zip(grid, cell))} would be named {name!r}, not a plain name; "
                           "list it under `variants:` with a name of its own")
            variants.append(_variant(name, dict(zip(grid, cell)), default_preset, common, f"{where} cell {name!r}",
                                     fail, check))
    return variants


def _claims(section: Any, ablation: dict, fail) -> tuple:
    """The file's claims as `ablations.claims.Claim` objects, each checked against the ablation."""
    if section is None:
        return ()
    from .columns import RUN_COLUMNS, TEXT_COLUMNS, WHOLE_RUN_SUFFIX
    from .definitions import Claim

    if not isinstance(section, list):
        raise fail("claims: a list of claims (each with claim, first, quantity, direction)")
    names = [v.name for v in ablation["variants"]]
    metric, extra = ablation["metric"], ablation["extra_metrics"]
    row_columns = [c for c in RUN_COLUMNS if c not in TEXT_COLUMNS]
    columns = row_columns + ["metric_value", metric, *extra] + [m + WHOLE_RUN_SUFFIX for m in extra]
    seeds_default = tuple(range(1, (ablation["seeds"] or DEFAULT_SEEDS) + 1))
    claims = []
    for number, entry in enumerate(section, start=1):
        where = f"claims[{number}]"
        if not isinstance(entry, dict):
            raise fail(f"{where}: a mapping (claim, first, second, quantity, direction ...)")
        _refuse_unknown(entry, CLAIM_FIELDS, "claim field", fail, where=f"{where}: ")
        for key in ("claim", "first", "quantity", "direction"):
            if key not in entry:
                raise fail(f"{where}: {key!r} is required")
        pair = []
        for key in ("first", "second"):
            variant = str(entry.get(key, names[0]))
            if variant not in names:
                raise fail(f"{where}.{key}: no variant {variant!r}{did_you_mean(variant, names)}")
            pair.append(variant)
        quantity = str(entry["quantity"])
        if quantity not in columns:
            raise fail(f"{where}.quantity: {quantity!r} is not a column of the results{did_you_mean(quantity, columns)}"
                       f"; the metric, an extra metric, or one of {', '.join(columns[:18])}")
        # The metric is the row's metric_value unless it is a column of the row itself.
        column = "metric_value" if quantity == metric and quantity not in row_columns else quantity
        direction = entry["direction"]
        if direction not in DIRECTIONS or isinstance(direction, bool):
            raise fail(f"{where}.direction: larger, smaller or equal (got {direction!r})")
        seeds = entry.get("seeds", list(seeds_default))
        if not isinstance(seeds, list) or not seeds or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in seeds):
            raise fail(f"{where}.seeds: a list of seeds >= 1 (got {seeds!r})")
        margin = entry.get("margin")
        if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))):
            raise fail(f"{where}.margin: a number (got {margin!r})")
        effect = entry.get("effect")
        if effect is not None and (isinstance(effect, bool) or not isinstance(effect, (int, float))):
            raise fail(f"{where}.effect: a number, the size the test must see (got {effect!r})")
        try:
            claims.append(Claim(str(entry["claim"]), str(entry.get("source", f"ablation {ablation['name']}")),
                                ablation["name"], (pair[0], column), (pair[1], column), DIRECTIONS[direction],
                                quantity, tuple(seeds), str(entry.get("family", "")),
                                None if margin is None else float(margin),
                                effect=None if effect is None else float(effect),
                                effect_basis=str(entry.get("effect_basis", "")),
                                seeds_basis=str(entry.get("seeds_basis", ""))))
        except ValueError as error:
            raise fail(f"{where}: {error}") from None
    return tuple(claims)


# ==========================================================================================
# The definition a sweep stores
# ==========================================================================================
def _plain(value: Any) -> Any:
    """A value YAML's safe dumper writes: tuples as lists, paths as text."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def definition(ablation: Ablation) -> dict:
    """`ablation` as an ablation file's mapping (what `parse_definition` reads back)."""
    presets = {v.preset for v in ablation.variants}
    common = presets.pop() if len(presets) == 1 else None
    data = {"name": ablation.name, "question": ablation.question}
    if common is not None:
        data["preset"] = common
    data.update(testbed=ablation.testbed, base=ablation.base.name, metric=ablation.metric,
                extra_metrics=list(ablation.extra_metrics))
    data.update({key: getattr(ablation, key) for key in ("seeds", "steps") if getattr(ablation, key) is not None})
    data["variants"] = {v.name: _plain({**({} if common else {"preset": v.preset}),
                                        **({"seed_offset": v.seed_offset} if v.seed_offset else {}), **v.overrides})
                        for v in ablation.variants}
    if ablation.claims:
        data["claims"] = [_claim_entry(c, ablation.metric) for c in ablation.claims]
    return data


def _claim_entry(claim, metric: str) -> dict:
    names = {1: "larger", -1: "smaller", 0: "equal"}
    column = claim.first[1]
    entry = {"claim": claim.claim, "first": claim.first[0], "second": claim.second[0],
             "quantity": metric if column == "metric_value" else column,
             "direction": names[claim.direction], "seeds": list(claim.seeds), "source": claim.source}
    if claim.family:
        entry["family"] = claim.family
    if claim.margin is not None:
        entry["margin"] = claim.margin
    if claim.effect is not None:
        entry["effect"] = claim.effect
    if claim.effect_basis:
        entry["effect_basis"] = claim.effect_basis
    if claim.seeds_basis:
        entry["seeds_basis"] = claim.seeds_basis
    return entry


def definition_path(sweep_dir: str | Path, name: str) -> Path:
    return Path(sweep_dir) / name / DEFINITION_FILE


def read_stored(sweep_dir: str | Path, name: str) -> Ablation | None:
    """The definition stored with the sweep for ablation `name`, or None when there is none.

    A stored file that cannot be read is an error (naming it), never a reason to fall back
    to another base or metric.
    """
    path = definition_path(sweep_dir, name)
    if not path.is_file():
        return None
    kwargs = parse_definition(read_mapping(path), source=str(path), strict=False)
    if kwargs["name"] != name:
        raise AblationFileError(f"{path}: defines ablation {kwargs['name']!r}, but lies in the folder of {name!r}")
    return Ablation(**kwargs)


def _differences(stored: Ablation, given: Ablation) -> list[str]:
    """What the given definition changes in the stored one that would change its results."""
    changes = []
    for what in ("metric", "testbed"):
        if getattr(stored, what) != getattr(given, what):
            changes.append(f"{what} {getattr(stored, what)!r} -> {getattr(given, what)!r}")
    if stored.base.name != given.base.name:
        changes.append(f"base {stored.base.name!r} -> {given.base.name!r}")
    old = {v.name: v for v in stored.variants}
    for variant in given.variants:
        before = old.get(variant.name)
        if before is not None and (before.preset, _plain(before.overrides)) != (variant.preset,
                                                                              _plain(variant.overrides)):
            changes.append(f"variant {variant.name!r} {before.preset} {_plain(before.overrides)} -> "
                           f"{variant.preset} {_plain(variant.overrides)}")
    return changes


def store_definitions(sweep_dir: str | Path, ablations: Iterable[Ablation]) -> list[Ablation]:
    """Write each ablation's definition into the sweep (`definition_path`); return them as stored.

    Checks every ablation before writing any: a stored definition that the given one
    changes (base, metric, testbed, a variant's preset or fields) raises `AblationFileError`,
    since the runs already there answer another question. Variants stored but not given
    (a sweep run with ``--variants``) stay in the stored definition, after the given ones, and so
    do stored claims on comparisons the given ablation does not register (a ``--variants`` sweep
    registers only the claims whose arms it runs; a given claim replaces a stored one on the
    same comparison).
    """
    merged = []
    for ablation in ablations:
        stored = read_stored(sweep_dir, ablation.name)
        if stored is not None:
            changes = _differences(stored, ablation)
            if changes:
                path = definition_path(sweep_dir, ablation.name)
                raise AblationFileError(
                    f"{path}: the sweep holds ablation {ablation.name!r} run under another definition "
                    f"({'; '.join(changes)}); its runs answer that one. Sweep into another --out, or move "
                    f"{path.parent} away to start this ablation over")
            given = {v.name for v in ablation.variants}
            compared = {(c.first, c.second) for c in ablation.claims}
            ablation = dataclasses.replace(
                ablation,
                variants=ablation.variants + tuple(v for v in stored.variants if v.name not in given),
                claims=ablation.claims + tuple(c for c in stored.claims if (c.first, c.second) not in compared))
        merged.append(ablation)
    for ablation in merged:
        path = definition_path(sweep_dir, ablation.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = (f"# The definition of ablation {ablation.name!r} this sweep ran: the report and `claims` read\n"
                f"# it; `python -m ablations run {DEFINITION_FILE}` runs it again.\n")
        path.write_text(text + yaml.safe_dump(definition(ablation), sort_keys=False, allow_unicode=True))
    return merged


def stored_names(sweep_dir: str | Path) -> list[str]:
    """The ablations of a sweep directory that have a stored definition."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return []
    return sorted(p.parent.name for p in sweep_dir.glob(f"*/{DEFINITION_FILE}") if p.is_file())
