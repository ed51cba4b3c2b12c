"""The power analysis behind each claim's registration (`ablations.power`): seeds for 80%
power by hand, per kind of test, and the table of the registered claims."""

from __future__ import annotations

import math

import pytest

from ablations import power
from ablations.definitions import Claim


def test_directed_seeds_by_hand():
    # sd 0.02, effect 0.025: 7 seeds see (2.447 + 0.906) * 0.02 / sqrt(7) = 0.02535 > 0.025, 8 see 0.0231.
    assert power.visible_size("directed", 0.02, 7) == pytest.approx((2.447 + 0.906) * 0.02 / math.sqrt(7))
    assert power.seeds_for("directed", 0.02, 0.025) == 8


def test_equivalence_seeds_by_hand():
    # TOST at 5% per side, 80% power at a true difference of 0: (t_0.95 + t_0.90) * sd / sqrt(n) <= margin.
    # sd 0.03, margin 0.03: 10 seeds (1.833 + 1.383) * 0.03 / sqrt(10) = 0.0305; 11 seeds (1.812 + 1.372) * 0.03 / sqrt(11) = 0.0288.
    assert power.visible_size("equivalence", 0.03, 10) == pytest.approx((1.833 + 1.383) * 0.03 / math.sqrt(10))
    assert power.seeds_for("equivalence", 0.03, 0.03) == 11


def test_non_inferiority_needs_fewer_seeds_than_equivalence_at_the_same_margin():
    # One one-sided test at 5% and 80% power: (t_0.95 + t_0.80) * sd / sqrt(n); 5 seeds: (2.132 + 0.941) * sd / sqrt(5).
    assert power.visible_size("non-inferiority", 0.01, 5) == pytest.approx((2.132 + 0.941) * 0.01 / math.sqrt(5))
    assert power.seeds_for("non-inferiority", 0.03, 0.03) < power.seeds_for("equivalence", 0.03, 0.03)


def test_no_size_or_no_spread_or_too_many_seeds():
    assert power.seeds_for("directed", float("nan"), 0.02) is None  # no pilot spread
    assert power.seeds_for("no margin", 0.02, 0.02) is None
    assert power.seeds_for("directed", 1.0, 0.001) is None  # more than 200 seeds
    assert power.seeds_for("directed", 0.0, 0.02) == 3  # no noise at all: the fewest a verdict takes


def rows(differences, base=0.4):
    out = []
    for seed, d in enumerate(differences, start=1):
        out += [{"ablation": "toy", "variant": "a", "seed": seed, "status": "ok", "final_sampled_accuracy": base + d},
                {"ablation": "toy", "variant": "b", "seed": seed, "status": "ok", "final_sampled_accuracy": base}]
    return out


def claim(direction, **kw):
    return Claim("a claim", "a source", "toy", ("a", "final_sampled_accuracy"), ("b", "final_sampled_accuracy"),
                 direction, "accuracy", (1, 2, 3, 4, 5), **kw)


def test_claim_power_reads_the_pilot_sd_of_the_paired_difference():
    pilot = rows([0.01, 0.03, 0.02, 0.00, 0.04])  # differences: sd = sqrt(0.00025) = 0.01581
    result = power.claim_power(claim(+1, effect=0.02, effect_basis="stated"), pilot)
    assert result["kind"] == "directed" and result["pilot_pairs"] == 5
    assert result["sd"] == pytest.approx(0.015811, rel=1e-4)
    assert result["seeds"] == power.seeds_for("directed", result["sd"], 0.02) and result["decidable"]
    # The same noise against a tenth of the size needs more seeds than the budget: not decidable.
    small = power.claim_power(claim(+1, effect=0.002), pilot)
    assert small["seeds"] is None or small["seeds"] > power.SEED_BUDGET
    assert not small["decidable"]


def test_claim_kinds_and_the_table_say_why_a_claim_is_left_out():
    pilot = rows([0.01, 0.03, 0.02, 0.00, 0.04])
    assert power.test_kind(claim(0)) == "no margin"
    assert power.test_kind(claim(0, margin=0.03)) == "equivalence"
    assert power.test_kind(claim(0, effect=0.03)) == "equivalence"  # a margin proposed for the rerun
    assert power.test_kind(claim(-1, margin=0.03)) == "non-inferiority"
    table = power.markdown(pilot, [claim(0), claim(+1, effect=0.002), claim(+1, effect=0.02)]).splitlines()
    assert "no: a claim of no difference needs a margin" in table[2]
    assert "left out of the verdicts" in table[3]
    assert table[4].endswith("| yes |")


def test_a_claim_effect_must_be_positive():
    with pytest.raises(ValueError, match="effect"):
        claim(+1, effect=0.0)


def test_every_registered_claim_states_a_size_and_its_basis():
    from ablations.claims import CLAIMS
    from ablations.registry import ABLATIONS

    registered = list(CLAIMS) + [c for ablation in ABLATIONS.values() for c in ablation.claims]
    missing = [c.claim for c in registered if (c.margin is None and c.effect is None) or not c.effect_basis]
    assert not missing, f"claims without a size for their power analysis: {missing}"


def test_power_cli_refuses_a_missing_file(tmp_path, capsys):
    assert power.main([str(tmp_path / "none.csv")]) == 2
    assert "ablations power" in capsys.readouterr().err


def test_an_ablation_files_claim_carries_its_effect_through_the_stored_definition(tmp_path):
    """`effect` / `effect_basis` of an ablation file's claim survive the definition a sweep
    stores, so `python -m ablations power` on that sweep plans with the file's own size."""
    from ablations.ablation_files import load_ablation_file, read_stored, store_definitions

    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nquestion: Does b drift less?\npreset: grpo\nmetric: kl_k1\nvariants:\n  a: {}\n  b: {kl_coef: 0.05}\n"
                    "claims:\n  - claim: b drifts less.\n    first: b\n    quantity: kl_k1\n"
                    "    direction: smaller\n    effect: 0.2\n    effect_basis: stated\n")
    ablation = load_ablation_file(path)
    assert ablation.claims[0].effect == 0.2 and ablation.claims[0].effect_basis == "stated"
    store_definitions(tmp_path / "sweep", [ablation])
    stored = read_stored(tmp_path / "sweep", "mine")
    assert stored.claims[0].effect == 0.2 and stored.claims[0].effect_basis == "stated"
    path.write_text(path.read_text().replace("effect: 0.2", "effect: big"))
    with pytest.raises(ValueError, match="effect"):
        load_ablation_file(path)


def test_held_out_accuracy_takes_the_smaller_sd_of_its_own_runs_and_the_aa_pilot():
    """Both pilots overstate a 16-draw pair's noise (module docstring): the smaller one plans."""
    pilot = rows([0.01, 0.03, 0.02, 0.00, 0.04])  # own sd 0.01581
    quieter = {"final_sampled_accuracy": {"sd": 0.01, "n": 20}}
    louder = {"final_sampled_accuracy": {"sd": 0.05, "n": 20}}
    aa = power.claim_power(claim(+1, effect=0.02), pilot, quieter)
    assert (aa["sd"], aa["pilot_pairs"], aa["pilot"]) == (0.01, 20, "A/A sweep")
    assert aa["seeds"] == power.seeds_for("directed", 0.01, 0.02)
    own = power.claim_power(claim(+1, effect=0.02), pilot, louder)
    assert own["pilot"] == "own runs" and own["sd"] == pytest.approx(0.015811, rel=1e-4)
    # another column (here a length) is planned from its own runs only
    other = Claim("a claim", "a source", "toy", ("a", "kl_k1"), ("b", "kl_k1"), +1, "kl", (1, 2, 3), effect=0.5)
    assert power.claim_power(other, pilot, quieter)["pilot"] == "own runs"
    # the committed A/A sweep is read per accuracy column
    committed = power.accuracy_pilot()
    assert committed["final_sampled_accuracy"]["n"] >= 20


def test_power_cli_writes_the_named_power_block_only(tmp_path, capsys):
    import csv

    data = tmp_path / "results.csv"
    with open(data, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["ablation", "variant", "seed", "status", "final_sampled_accuracy"])
        writer.writeheader()
        writer.writerows(rows([0.01, 0.03, 0.02, 0.00, 0.04]))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- generated:power -->\nold\n<!-- /generated:power -->\n"
                   "<!-- generated:power:toy -->\nold\n<!-- /generated:power:toy -->\n")
    assert power.main([str(data), "--update", str(doc), "--block", "power:toy"]) == 0
    text = doc.read_text()
    assert text.startswith("<!-- generated:power -->\nold\n") and "| claim | quantity |" in text.split("power:toy")[1]
    with pytest.raises(SystemExit):
        power.main([str(data), "--update", str(doc), "--block", "claims"])
    assert "a power block is named power or power:DIR" in capsys.readouterr().err
