"""What an ablation is: `Variant` (a preset plus `PPOConfig` overrides), `Ablation` (a
question, its variants, the metric that answers it), `register` and the table `ABLATIONS`;
`Claim` (what a sweep of it should show, registered before its runs) and its `Amendment`.

The built-in entries register themselves in `ablations.registry` and
`ablations.registry_details`; an ablation file (`ablations.ablation_files`) registers its own
the same way. Import `ablations.registry` for the full table, this module for the types alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ppo.config import PPOConfig, preset

# The report's own folder in a sweep directory: no ablation may be called so.
RESERVED_NAMES = ("plots",)


def check_name(kind: str, name) -> str:
    """`name` if it can be one folder of a sweep directory, else ValueError naming it.

    Ablation and variant names become folders (``SWEEP/<ablation>/<variant>/seed<k>``), so a
    separator, ``..``, an absolute name or a leading dot would put a run elsewhere (and its
    preparation would clear whatever is there) or hide it.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{kind} name {name!r}: must be a non-empty string")
    separators = [c for c in {"/", "\\", os.sep, "\0"} if c in name]
    if separators:
        why = f"contains {separators[0]!r}"
    elif name.startswith("."):
        why = "starts with '.'"
    elif name != name.strip():
        why = "has leading or trailing spaces"
    elif len(name) > 200:
        why = "is longer than 200 characters"
    elif kind == "ablation" and name in RESERVED_NAMES:
        why = "is the report's plots/ folder"
    else:
        return name
    raise ValueError(f"{kind} name {name!r}: {why}; a name is one folder of the sweep directory, never a path "
                     "(use letters, digits, '_' and '-')")


@dataclass(frozen=True)
class Variant:
    """One arm of an ablation: a preset and the fields it changes.

    `seed_offset` shifts the arm's training seed (seed k runs with seed k + offset) while the
    sweep still pairs it with the other arms' seed k: two arms identical but for the offset
    are an A/A pair, whose differences show the verdicts' false-positive rate (ablations/aa.py).
    """

    name: str
    preset: str
    overrides: dict = field(default_factory=dict, hash=False)
    seed_offset: int = 0

    def __post_init__(self):
        check_name("variant", self.name)


@dataclass(frozen=True)
class Ablation:
    name: str
    question: str
    variants: tuple[Variant, ...]
    metric: str
    extra_metrics: tuple[str, ...] = ()
    steps: int | None = None  # None: the preset's (testbed) value
    testbed: bool = True  # scale the presets for the CPU testbed (`ppo.presets.TESTBED_SCALE`)
    seeds: int | None = None  # seeds a sweep runs when its command names none (None: the command's default)
    claims: tuple = ()  # claims registered with the ablation (`ablations.claims.Claim`), e.g. from a file

    @property
    def base(self) -> Variant:
        """The variant every other one is compared with: the first."""
        return self.variants[0]

    def __post_init__(self):
        check_name("ablation", self.name)
        for variant in self.variants:
            check_name(f"ablation {self.name!r}: variant", getattr(variant, "name", variant))

    def config(self, variant: Variant, seed: int, output_dir: str, steps: int | None = None) -> PPOConfig:
        """The full config of one run of `variant`."""
        overrides = dict(variant.overrides)
        total_steps = steps or self.steps
        if total_steps is not None:
            overrides["total_steps"] = total_steps
        return preset(variant.preset, testbed=self.testbed, seed=seed + variant.seed_offset, output_dir=output_dir,
                      progress=False, **overrides)

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise ValueError(f"ablation {self.name!r} has no variant {name!r}; variants: {[v.name for v in self.variants]}")


ABLATIONS: dict[str, Ablation] = {}


def register(name: str, question: str, variants: list[Variant], metric: str,
             extra_metrics: tuple[str, ...] = (), steps: int | None = None, testbed: bool = True,
             seeds: int | None = None, claims: tuple = ()) -> Ablation:
    check_name("ablation", name)
    if name in ABLATIONS:
        raise ValueError(f"ablation {name!r} is already registered")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"ablation {name!r}: duplicate variant names {names}")
    ablation = Ablation(name, question, tuple(variants), metric, tuple(extra_metrics), steps, testbed, seeds,
                        tuple(claims))
    ABLATIONS[name] = ablation
    return ablation


def get_ablation(name: str) -> Ablation:
    if name not in ABLATIONS:
        raise ValueError(f"unknown ablation {name!r}; known: {', '.join(sorted(ABLATIONS))}")
    return ABLATIONS[name]


# The base presets most entries vary: AlpacaFarm's PPO and GRPO.
PPO, GRPO = "alpacafarm", "grpo"


# ---------------------------------------------------------------------- claims
@dataclass(frozen=True)
class Amendment:
    """A change made to a registered claim after its registration: the new quantity and/or
    seeds, and why. The verdict stays the registered test's; the amended test is shown
    beside it as post hoc."""

    first: tuple[str, str]
    second: tuple[str, str]
    seeds: tuple[int, ...]
    why: str


@dataclass(frozen=True)
class Claim:
    """One claim: ``first - second`` (paired by seed) should have the sign of `direction`.

    `first` and `second` are ``(variant, column)`` pairs of one ablation's ``results.csv``
    rows; they may be the same variant (e.g. the logged KL minus the true KL of one run).
    `seeds` are the seeds registered for the test. `family` groups the parts of one
    several-part claim (Holm's correction over them); `margin`, stated before the runs in the
    column's units, is the equivalence margin of a claim of no difference (direction 0:
    ``|first - second| < margin``) or the non-inferiority margin of a directed claim (direction
    +1: ``first - second > -margin``, "the first is no worse than the second by more than the
    margin"; -1 mirrored). `effect` is the size a directed claim's test must see, in the
    column's units, and `effect_basis` where that size comes from (the effect the source
    reports, or a stated smallest effect of interest); for a claim with a margin,
    `effect_basis` says why that margin. `ablations.power` turns the size and a pilot's noise
    into the seeds the test needs; `seeds_basis` records that reasoning for the registered
    seeds (which pilot, its sd, the seeds it asked for), written before the runs.
    """

    claim: str  # what the course says, in one sentence
    source: str  # where the claim comes from
    ablation: str
    first: tuple[str, str]
    second: tuple[str, str]
    direction: int  # +1, -1, or 0 for "no difference"; with a margin, +1 / -1 claim non-inferiority
    quantity: str  # what is compared, in words
    seeds: tuple[int, ...] = ()
    family: str = ""
    margin: float | None = None
    amendments: tuple[Amendment, ...] = ()
    effect: float | None = None
    effect_basis: str = ""
    seeds_basis: str = ""

    def __post_init__(self):
        if self.direction not in (-1, 0, 1):
            raise ValueError(f"claim {self.claim!r}: direction must be -1, 0 or +1, got {self.direction}")
        if not self.seeds:
            raise ValueError(f"claim {self.claim!r}: no registered seeds")
        if self.margin is not None and not self.margin > 0:
            raise ValueError(f"claim {self.claim!r}: margin (equivalence or non-inferiority) must be > 0")
        if self.effect is not None and not self.effect > 0:
            raise ValueError(f"claim {self.claim!r}: effect (the size the test must see) must be > 0")

    def comparison(self, first: tuple[str, str] | None = None, second: tuple[str, str] | None = None) -> str:
        """The comparison with its columns, e.g. ```std` - `no_std` in `adv_share_level0```."""
        (v1, c1), (v2, c2) = first or self.first, second or self.second
        if v1 == v2:
            return f"`{v1}`: `{c1}` - `{c2}`"
        if c1 == c2:
            return f"`{v1}` - `{v2}` in `{c1}`"
        return f"`{v1}`.`{c1}` - `{v2}`.`{c2}`"

    def family_key(self) -> str:
        return self.family or self.claim
