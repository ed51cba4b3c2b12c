"""Claim verdicts (ablations/claims.py) and generated doc tables (ablations/doc_tables.py), on hand-computed numbers.

    first  [0.7, 0.8, 0.9], second [0.5, 0.6, 0.8] -> differences [0.2, 0.2, 0.1]
    mean 0.1667, sd sqrt(((1/30)^2 * 2 + (2/30)^2) / 2) = 0.05774,
    95% half-width 4.303 * 0.05774 / sqrt(3) = 0.1434 (excludes 0: separated),
    detectable (4.303 + 1.061) * 0.05774 / sqrt(3) = 0.1788
"""

import json
import re
from pathlib import Path

import pytest

from ablations import claims, doc_blocks, doc_tables
from ablations.claims import Claim, claim_verdict, evaluate_claim

ROOT = Path(__file__).resolve().parent.parent


def rows_for(ablation, values, status="ok"):
    """results.csv-like rows: values = {variant: {column: [per-seed values]}}."""
    rows = []
    for variant, columns in values.items():
        n = len(next(iter(columns.values())))
        for seed in range(n):
            rows.append({"ablation": ablation, "variant": variant, "seed": seed + 1, "status": status,
                         **{column: per_seed[seed] for column, per_seed in columns.items()}})
    return rows


ROWS = rows_for("toy", {"base": {"final_sampled_accuracy": [0.5, 0.6, 0.8], "kl": [3.0, 4.0, 5.0],
                                 "kl_k1": [2.0, 3.0, 4.5], "metric_value": [1.0, 2.0, 3.0]},
                        "other": {"final_sampled_accuracy": [0.7, 0.8, 0.9], "kl": [1.0, 1.0, 1.0],
                                  "kl_k1": [1.0, 1.0, 1.0], "metric_value": [1.5, 1.0, 3.2]}})


def claim(direction, first=("other", "final_sampled_accuracy"), second=("base", "final_sampled_accuracy"), **kw):
    return Claim("a claim", "a source", "toy", first, second, direction, "accuracy", (1, 2, 3), **kw)


def test_paired_claim_matches_hand_computation():
    result = evaluate_claim(claim(+1), ROWS)
    assert result["n"] == 3
    assert result["mean"] == pytest.approx(0.16667, abs=1e-4)
    assert result["ci"] == pytest.approx(0.1434, abs=1e-3)
    assert result["detectable"] == pytest.approx(0.1788, abs=1e-3)
    assert result["separated"] and result["verdict"] == "reproduced"


@pytest.mark.parametrize("direction, expected", [
    (+1, "reproduced"), (-1, "contradicted"), (0, "contradicted"),
])
def test_verdict_of_a_separated_difference_depends_on_the_claimed_direction(direction, expected):
    assert evaluate_claim(claim(direction), ROWS)["verdict"] == expected


def test_a_difference_inside_its_interval_is_not_detected_or_consistent():
    # metric_value: differences [0.5, -1.0, 0.2]: mean -0.1, interval wide
    first, second = ("other", "metric_value"), ("base", "metric_value")
    assert evaluate_claim(claim(+1, first, second), ROWS)["verdict"].startswith(
        "not detected at 3 seeds (smallest detectable")
    # a claim of no difference without a registered margin is never "consistent"
    assert evaluate_claim(claim(0, first, second), ROWS)["verdict"].endswith(
        "; no equivalence margin registered)")


def test_a_not_detected_directed_claim_says_when_its_registered_size_is_outside_the_interval():
    """differences [0.5, -1.0, 0.2]: mean -0.1, sd sqrt(0.63) = 0.7937, 95% half-width
    4.303 * 0.7937 / sqrt(3) = 1.972: the interval is [-2.072, 1.872]. A size of 2 on the
    larger side lies beyond 1.872 (ruled out); 1.5 does not. On the smaller side -2 is inside,
    -2.5 beyond. The verdict stays "not detected"."""
    first, second = ("other", "metric_value"), ("base", "metric_value")
    outside = "; the registered size {} is outside the 95% interval"
    assert evaluate_claim(claim(+1, first, second, effect=2.0), ROWS)["verdict"].endswith(outside.format(2))
    assert "outside" not in evaluate_claim(claim(+1, first, second, effect=1.5), ROWS)["verdict"]
    assert "outside" not in evaluate_claim(claim(-1, first, second, effect=2.0), ROWS)["verdict"]
    verdict = evaluate_claim(claim(-1, first, second, effect=2.5), ROWS)["verdict"]
    assert verdict.startswith("not detected at 3 seeds") and verdict.endswith(outside.format(2.5))


def test_within_variant_claim_pairs_two_columns_of_one_run():
    # base: kl - kl_k1 = [1.0, 1.0, 0.5]: mean 0.833, sd 0.2887, half-width 0.717 -> separated
    result = evaluate_claim(claim(+1, ("base", "kl"), ("base", "kl_k1")), ROWS)
    assert result["mean"] == pytest.approx(0.8333, abs=1e-4)
    assert result["ci"] == pytest.approx(4.303 * 0.28868 / 3 ** 0.5, abs=1e-3)
    assert result["verdict"] == "reproduced"


def test_missing_ablation_or_single_seed_is_not_tested():
    assert claim_verdict(+1, {"n": 0}) == "not tested: not in this sweep"
    assert evaluate_claim(Claim("c", "s", "absent", ("a", "kl"), ("b", "kl"), 1, "q", (1,)), ROWS)["verdict"] == \
        "not tested: not in this sweep"
    assert evaluate_claim(claim(+1, ("other", "kl_full"), ("base", "kl_full")), ROWS)["verdict"] == \
        "not tested: the registered quantity is not logged in this sweep"
    one_seed = [r for r in ROWS if r["seed"] == 1]
    assert evaluate_claim(claim(+1), one_seed)["verdict"] == "too few seeds (1 pair; a verdict needs 3)"
    two_seeds = [r for r in ROWS if r["seed"] <= 2]  # accuracy +0.2, +0.2: equal differences
    assert evaluate_claim(claim(+1), two_seeds)["verdict"] == "too few seeds (2 pairs; a verdict needs 3)"


def test_failed_runs_never_enter_a_claim():
    failed = [{**r, "status": "failed"} if r["variant"] == "other" and r["seed"] == 3 else r for r in ROWS]
    assert evaluate_claim(claim(+1), failed)["n"] == 2
    assert evaluate_claim(claim(+1), failed)["missing_seeds"] == [3]


def test_glance_table_has_one_line_per_non_base_variant_with_computed_verdicts():
    table = doc_tables.glance_table(ROWS).splitlines()
    assert len(table) == 3  # header, rule, one variant
    assert table[2].startswith("| `toy` | `other` - `base` |")
    assert "+0.167 ± 0.143 | separated |" in table[2]  # accuracy, as hand-computed above
    assert "no difference detected at n=3" in table[2]  # the metric, [0.5, -1.0, 0.2]


def test_read_results_parses_a_report_csv(tmp_path):
    from ablations.report import _write_csv

    path = tmp_path / "results.csv"
    _write_csv(path, ROWS, ("ablation", "variant", "seed", "status"))
    back = claims.read_results(path)
    assert back == ROWS
    bad = tmp_path / "bad.csv"
    bad.write_text("ablation,variant,seed,status,kl\ntoy,a,one,ok,1.0\n")
    with pytest.raises(ValueError, match="line 2"):
        claims.read_results(bad)
    with pytest.raises(FileNotFoundError):
        claims.read_results(tmp_path / "nowhere.csv")
    # A directory holding only a results.csv (a sweep committed as its tables) reads that file;
    # a directory with neither runs nor results.csv is named, not read as an empty sweep.
    assert claims.read_results(tmp_path) == ROWS
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no run directories and no results.csv"):
        claims.read_results(tmp_path / "empty")


def test_replace_block_rewrites_only_between_the_markers():
    text = "intro\n<!-- generated:glance -->\nold\n<!-- /generated:glance -->\noutro\n"
    new = doc_blocks.replace_block(text, "glance", "| new |")
    assert new == "intro\n<!-- generated:glance -->\n| new |\n<!-- /generated:glance -->\noutro\n"
    assert doc_blocks.generated_block(new, "glance") == "| new |"
    with pytest.raises(ValueError, match="generated:claims"):
        doc_blocks.replace_block(text, "claims", "x")


def test_cli_update_writes_both_blocks(tmp_path, capsys):
    from ablations.report import _write_csv

    data = tmp_path / "results.csv"
    _write_csv(data, ROWS, ("ablation", "variant", "seed", "status"))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- generated:claims -->\n<!-- /generated:claims -->\n\n"
                   "<!-- generated:glance -->\n<!-- /generated:glance -->\n")
    assert doc_tables.main([str(data)]) == 0 and "| claim (source) |" in capsys.readouterr().out
    assert doc_tables.main([str(data), "--update", str(doc)]) == 0
    text = doc.read_text()
    assert doc_blocks.generated_block(text, "glance") == doc_tables.glance_table(ROWS)
    assert "not tested: not in this sweep" in doc_blocks.generated_block(text, "claims")
    assert doc_tables.main([str(tmp_path / "missing.csv")]) == 2


def test_docs_results_tables_are_the_generated_ones():
    """docs/results.md's claims and at-a-glance tables say exactly what the committed data says."""
    data = ROOT / "docs" / "results" / "data" / "results.csv"
    text = (ROOT / "docs" / "results.md").read_text()
    rows = claims.read_results(data)
    names = doc_blocks.block_names(text)
    assert {"claims", "glance"} <= set(names)
    for name, content in doc_tables.generated_tables(rows, [n for n in names if not doc_tables.written_elsewhere(n)]).items():
        assert doc_blocks.generated_block(text, name) == content, name
    # The power analysis (python -m ablations power) reads the same committed data as its pilot,
    # and each power:DIR block the sweep committed in docs/results/DIR.
    from ablations.power import accuracy_pilot, markdown as power_markdown, power_table

    assert doc_blocks.generated_block(text, "power") == power_markdown(rows, claims.CLAIMS, accuracy_pilot())
    directories = [n.split(":", 1)[1] for n in names if n.startswith("power:")]
    assert "staleness" in directories
    for directory in directories:
        assert doc_blocks.generated_block(text, f"power:{directory}") == power_table(claims.RESULTS_DIR / directory / "results.csv"), directory


def test_cli_update_fills_ablation_table_blocks(tmp_path):
    from ablations.report import _write_csv

    data = tmp_path / "results.csv"
    _write_csv(data, ROWS, ("ablation", "variant", "seed", "status"))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- generated:table:toy -->\n<!-- /generated:table:toy -->\n<!-- generated:bogus -->\n"
                   "<!-- /generated:bogus -->\n")
    assert doc_tables.main([str(data), "--update", str(doc)]) == 2  # an unknown block name is refused
    doc.write_text("<!-- generated:table:toy -->\n<!-- /generated:table:toy -->\n")
    assert doc_tables.main([str(data), "--update", str(doc)]) == 0
    block = doc_blocks.generated_block(doc.read_text(), "table:toy")
    assert "| other | 3/3 | 0.800 ± 0.248 |" in block  # mean of [0.7, 0.8, 0.9], 4.303 * 0.1 / sqrt(3)
    assert "Paired by seed against `base`" in block and "| other | final_sampled_accuracy | +0.167 ± 0.143 |" in block


def test_pairs_block_compares_with_another_variant():
    """pairs:ABLATION:VARIANT pairs every other variant against VARIANT: here `base` minus
    `other` in accuracy, the hand-computed pair negated (-0.167 ± 0.143)."""
    block = doc_tables.generated_tables(ROWS, ["pairs:toy:other"])["pairs:toy:other"]
    assert "Paired by seed against `other`" in block
    assert "| base | final_sampled_accuracy | -0.167 ± 0.143 | 3 | separated |" in block
    with pytest.raises(ValueError, match="no variant 'missing'"):
        doc_tables.generated_tables(ROWS, ["pairs:toy:missing"])


# ---- pre-registration: seeds, amendments, Holm, equivalence margins --------------------------
def test_holm_adjustment_matches_hand_computation():
    # sorted 0.01, 0.03, 0.04 -> 3 * 0.01, max(0.03, 2 * 0.03), max(0.06, 1 * 0.04)
    assert claims.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert claims.holm([0.2, float("nan")])[0] == pytest.approx(0.2)  # an untestable part does not count


def test_two_parts_of_one_claim_are_holm_corrected():
    """Accuracy differences [0.2, 0.2, 0.1]: t = 0.1667 / (0.05774 / sqrt(3)) = 5.0 with 2 df,
    p = 1 - 5 / sqrt(27) = 0.0377: reproduced alone, but two such parts of one claim have
    Holm-adjusted p 2 * 0.0377 = 0.0755 each: not detected."""
    alone = evaluate_claim(claim(+1), ROWS)
    assert alone["p"] == pytest.approx(0.03775, abs=1e-4) and alone["verdict"] == "reproduced"
    parts = [claim(+1, family="f"), claim(+1, family="f")]
    results = claims.evaluate_claims(ROWS, parts)
    for result in results:
        assert result["p_holm"] == pytest.approx(2 * 0.03775, abs=2e-4) and result["family_size"] == 2
        assert result["verdict"].startswith("not detected at 3 seeds")
    assert "(Holm over 2: 0.0755)" in claims.claims_table(ROWS, parts)


EQUAL = rows_for("toy", {"base": {"final_sampled_accuracy": [0.50, 0.60, 0.70]},
                         "other": {"final_sampled_accuracy": [0.51, 0.59, 0.70]}})


def test_no_difference_is_consistent_only_inside_a_registered_margin():
    """Differences [+0.01, -0.01, 0]: mean 0, sd 0.01, se 0.005774, 2 df. Margin 0.05:
    t = 8.66 on each side, one-sided p = (1 - 8.66 / sqrt(8.66^2 + 2)) / 2 = 0.0065 < 0.05:
    consistent. Margin 0.01: t = 1.732, one-sided p = (1 - 1.732 / sqrt(5)) / 2 = 0.113: not shown."""
    wide = evaluate_claim(claim(0, margin=0.05), EQUAL)
    assert wide["primary_p"] == pytest.approx((1 - 8.6603 / (8.6603 ** 2 + 2) ** 0.5) / 2, abs=1e-4)
    assert wide["verdict"] == "consistent: within the registered margin ±0.050"
    narrow = evaluate_claim(claim(0, margin=0.01), EQUAL)
    assert narrow["primary_p"] == pytest.approx((1 - 3 ** 0.5 / 5 ** 0.5) / 2, abs=1e-4)
    assert narrow["verdict"].startswith("not detected at 3 seeds") and "±0.010 not shown" in narrow["verdict"]
    assert evaluate_claim(claim(0), EQUAL)["verdict"].startswith("not detected at 3 seeds")
    # a separated difference still contradicts a claim of no difference, margin or not
    assert evaluate_claim(claim(0, margin=0.01), ROWS)["verdict"] == "contradicted"
    with pytest.raises(ValueError, match="margin"):
        claim(0, margin=0.0)


def test_a_directed_claim_with_a_margin_is_one_of_non_inferiority():
    """"The first is no worse than the second by more than the margin". EQUAL, differences
    [+0.01, -0.01, 0] (se 0.005774): margin 0.05, t = 0.05 / se = 8.66, one-sided p = 0.0065:
    reproduced, on either side; margin 0.01, t = 1.732, p = 0.113: not shown. ROWS, differences
    [0.2, 0.2, 0.1] (mean 0.1667, se 0.03333): claimed not smaller, t = (0.1667 + 0.05) / se = 6.5,
    p = (1 - 6.5 / sqrt(6.5^2 + 2)) / 2 = 0.0114: reproduced; claimed not larger, t = -3.5 and the
    inferiority test's p = (1 - 3.5 / sqrt(3.5^2 + 2)) / 2 = 0.0364: contradicted."""
    shown = evaluate_claim(claim(+1, margin=0.05), EQUAL)
    assert shown["primary_p"] == pytest.approx((1 - 8.6603 / (8.6603 ** 2 + 2) ** 0.5) / 2, abs=1e-4)
    assert shown["verdict"] == "reproduced: no worse than the registered margin 0.050"
    assert evaluate_claim(claim(-1, margin=0.05), EQUAL)["verdict"] == shown["verdict"]
    narrow = evaluate_claim(claim(+1, margin=0.01), EQUAL)
    assert narrow["primary_p"] == pytest.approx((1 - 3 ** 0.5 / 5 ** 0.5) / 2, abs=1e-4)
    assert narrow["verdict"].startswith("not detected at 3 seeds") and "non-inferiority within 0.010 not shown" in \
        narrow["verdict"]
    better = evaluate_claim(claim(+1, margin=0.05), ROWS)
    assert better["primary_p"] == pytest.approx((1 - 6.5 / (6.5 ** 2 + 2) ** 0.5) / 2, abs=2e-3)
    assert better["verdict"].startswith("reproduced")
    worse = evaluate_claim(claim(-1, margin=0.05), ROWS)
    assert worse["inferior_p"] == pytest.approx((1 - 3.5 / (3.5 ** 2 + 2) ** 0.5) / 2, abs=2e-3)
    assert worse["verdict"] == "contradicted"
    row = claims.claims_table(EQUAL, [claim(+1, margin=0.05)]).splitlines()[2]
    assert "| first not smaller (non-inferiority margin 0.050) |" in row
    with pytest.raises(ValueError, match="margin"):
        claim(+1, margin=-0.05)


def test_the_verdict_uses_registered_seeds_and_shows_amendments():
    """Data for seeds 1-4; registered 1-3. Seed 4 (accuracy -0.5) is left out and named; the
    amended test on seeds 1-4 is shown beside the registered verdict, post hoc."""
    rows = ROWS + [
        {"ablation": "toy", "variant": "base", "seed": 4, "status": "ok", "final_sampled_accuracy": 0.9},
        {"ablation": "toy", "variant": "other", "seed": 4, "status": "ok", "final_sampled_accuracy": 0.4}]
    plain = claim(+1)
    result = evaluate_claim(plain, rows)
    assert result["n"] == 3 and result["verdict"] == "reproduced" and result["unregistered_seeds"] == [4]
    assert "seeds 4 in the data, not registered: left out" in claims.claims_table(rows, [plain])
    # A seed only one arm ran (the base's, here) was never a pair: it is not named.
    one_arm = rows + [{"ablation": "toy", "variant": "base", "seed": 5, "status": "ok", "final_sampled_accuracy": 0.5}]
    assert evaluate_claim(plain, one_arm)["unregistered_seeds"] == [4]
    amendment = claims.Amendment(("other", "final_sampled_accuracy"), ("base", "final_sampled_accuracy"),
                                 (1, 2, 3, 4), "seed 4 added")
    amended = claim(+1, amendments=(amendment,))
    row = claims.claims_table(rows, [amended]).splitlines()[2]
    # differences [0.2, 0.2, 0.1, -0.5]: mean 0, not detected
    assert "| reproduced | changed after registration: seed 4 added; amended test (post hoc):" in row
    assert "seeds 1-4: +0.000 ± " in row and row.count("not detected at 4 seeds") == 1


def test_every_claim_registers_a_quantity_its_ablation_logs():
    """The registered columns are ones the ablation's runs write, its variants exist, and
    at least 3 seeds are registered (a verdict needs 3 pairs)."""
    from ablations.run_results import RUN_COLUMNS, WHOLE_RUN_SUFFIX, ablation_spec

    for registered in claims.CLAIMS:
        spec = ablation_spec(registered.ablation)
        logged = set(RUN_COLUMNS) | set(spec.extra_metrics) | {m + WHOLE_RUN_SUFFIX for m in spec.extra_metrics}
        tests = [(registered.first, registered.second)] + [(a.first, a.second) for a in registered.amendments]
        for (v1, c1), (v2, c2) in tests:
            assert {v1, v2} <= set(spec.variants), registered.claim
            assert {c1, c2} <= logged, (registered.claim, c1, c2)
        assert len(registered.seeds) >= 3, registered.claim


def test_docs_claims_table_reports_each_registered_quantity():
    """Row i of docs/results.md's claims table tests CLAIMS[i] on its registered columns and
    seeds, and says when the registry changed it after registration."""
    text = (ROOT / "docs" / "results.md").read_text()
    rows = doc_blocks.generated_block(text, "claims").splitlines()[2:]
    assert len(rows) == len(claims.CLAIMS)
    for row, registered in zip(rows, claims.CLAIMS):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[1] == f"`{registered.ablation}`: {registered.comparison()}", registered.claim
        assert cells[2] == registered.quantity.replace("|", "\\|")
        assert cells[4].startswith(claims._seed_list(registered.seeds) + " ("), registered.claim
        assert ("changed after registration" in cells[-1]) == bool(registered.amendments), registered.claim


def test_reproduce_plan_runs_every_arm_of_every_claim_at_its_seeds(tmp_path):
    """`python -m ablations reproduce` regenerates every claim: each registered (and amended)
    arm is a run of its plan at every registered seed, at >= 5 seeds, and each step runs the
    seeds up to the highest its ablation's claims registered, no more."""
    from ablations import reproduce

    planned = {(spec.ablation, spec.variant, spec.seed) for spec in reproduce.planned_specs(tmp_path)}
    for registered in claims.CLAIMS:
        assert len(registered.seeds) >= 5, registered.claim
        tests = [(registered.first, registered.second, registered.seeds)]
        tests += [(a.first, a.second, a.seeds) for a in registered.amendments]
        for (v1, _), (v2, _), seeds in tests:
            missing = {(registered.ablation, v, s) for v in (v1, v2) for s in seeds} - planned
            assert not missing, (registered.claim, sorted(missing))
    for step in reproduce.PLAN:
        registered = [max(c.seeds) for c in claims.CLAIMS if c.ablation == step.ablation]
        assert registered and step.seeds == max(registered), step.ablation
    assert len({step.ablation for step in reproduce.PLAN}) == len(reproduce.PLAN)


def test_every_claim_registers_the_seeds_its_power_analysis_asked_for():
    """The registration writes beside each claim the seeds the pilot asked for
    (`seeds_basis`, "...: N seeds"); the claim runs at least those, within the seed budget."""
    from ablations.power import SEED_BUDGET

    for registered in claims.CLAIMS:
        asked = re.search(r"(\d+) seeds", registered.seeds_basis)
        assert asked, registered.claim
        assert int(asked.group(1)) <= len(registered.seeds) <= SEED_BUDGET, registered.claim
        assert registered.margin is not None or registered.direction != 0, registered.claim


def test_reproduce_dry_run_prints_the_plan_and_a_projection_without_running(tmp_path, capsys, monkeypatch):
    """--dry-run times each distinct run (here stubbed: the timing itself is ablations.estimate's,
    tested there) and trains nothing."""
    from ablations import estimate, reproduce

    timed = []

    def fake_time_run(ablation, variant, config, runs, timed_steps, startup):
        timed.append((ablation, variant, runs))
        return estimate.RunEstimate(ablation, variant, config.total_steps, 1.0, 0.5, 2.0, 0.1, 3, 1, 0.0, runs)

    monkeypatch.setattr(estimate, "time_run", fake_time_run)
    assert reproduce.main(["--dry-run", "--out", str(tmp_path / "sw"), "--report-dir", str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out
    assert f"python -m ablations run length_norm_room --seeds 5 --steps 60 --out {tmp_path / 'sw'}/length_norm_room" in out
    assert "Projected:" in out and f"0 of {len(reproduce.PLAN)} steps done" in out
    assert not (tmp_path / "sw").exists()
    # one timing per distinct config: seeds and copies of identical runs are not timed again
    assert len(timed) == len({(a, v) for a, v, _ in timed})
    assert sum(runs for _, _, runs in timed) < len(reproduce.planned_specs(tmp_path / "sw"))


def _committed_step(report_dir, ablation, variants, seeds, commit="a" * 40, dirty=False, samples=60 * 64):
    import csv

    (report_dir / ablation).mkdir(parents=True, exist_ok=True)
    with open(report_dir / ablation / "results.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["ablation", "variant", "seed", "status", "final_sampled_accuracy", "samples", "prov_commit",
                         "prov_dirty"])
        writer.writerows([ablation, v, s, "ok", 0.5, samples, commit, dirty] for v in variants for s in seeds)


def test_reproduce_runs_each_step_into_its_own_sweep_and_skips_the_committed_ones(tmp_path, capsys, monkeypatch):
    """The part after the timing (run_sweep stubbed: it is tested in test_ablation_runner): a
    step whose runs finished is reported and copied to the report directory; a step already
    committed from a clean commit is skipped; docs change only once every step is done, then
    from the union of the steps' results."""
    import types

    import ppo.run.provenance
    import ppo.tasks.rlhf
    from ablations import estimate, reproduce, runner
    from tests.test_reproducibility import _finished_run

    def fake_run_sweep(ablations, out, **kwargs):
        ran.append(out)
        failed = [types.SimpleNamespace(spec=types.SimpleNamespace(label=f"{out.name}/constant/seed3"))]
        return types.SimpleNamespace(failed=failed if out.name == "length_norm" else [])

    plan = (reproduce.SweepStep("length_norm", seeds=3), reproduce.SweepStep("length_norm_room", seeds=3))
    monkeypatch.setattr(reproduce, "PLAN", plan)
    sweep, reruns = tmp_path / "sw", tmp_path / "reruns"
    for seed in (1, 2, 3):
        for variant in ("per_sequence", "constant"):
            _finished_run(sweep / "length_norm_room" / "length_norm_room" / variant / f"seed{seed}", "a" * 40,
                          "weak", 0.3, samples=60 * 64)
    ran = []
    monkeypatch.setattr(ppo.tasks.rlhf, "is_built", lambda path: True)
    monkeypatch.setattr(estimate, "time_run", lambda ablation, variant, config, runs, *a:
                        estimate.RunEstimate(ablation, variant, 1, 1.0, 0.5, 2.0, 0.1, 3, 1, 0.0, runs))
    monkeypatch.setattr(runner, "run_sweep", fake_run_sweep)
    monkeypatch.setattr(ppo.run.provenance, "source_version", lambda: ("c" * 40, False))
    doc = tmp_path / "results.md"
    doc.write_text("<!-- generated:glance -->\n<!-- /generated:glance -->\n")
    args = ["--out", str(sweep), "--data", str(tmp_path / "data.csv"), "--doc", str(doc), "--report-dir", str(reruns)]
    _committed_step(reruns, "length_norm", ("per_sequence", "constant"), (1, 2), dirty=False)  # seed 3 missing
    assert reproduce.main(args) == 1  # a run of length_norm failed: that step is not done, the other is
    assert "1 runs or steps failed (length_norm/constant/seed3)" in capsys.readouterr().err
    assert ran == [sweep / "length_norm", sweep / "length_norm_room"]
    assert (reruns / "length_norm_room" / "results.csv").read_text() == \
        (sweep / "length_norm_room" / "results.csv").read_text()
    assert "warm start weak" in (reruns / "length_norm_room" / "report.md").read_text()
    assert not (tmp_path / "data.csv").exists() and "generated:glance -->\n<!--" in doc.read_text()
    _committed_step(reruns, "length_norm", ("per_sequence", "constant"), (1, 2, 3))
    ran.clear()
    assert reproduce.main(args) == 0
    out = capsys.readouterr().out
    assert "2 of 2 steps done" in out and ran == []
    merged = claims.read_results(tmp_path / "data.csv")
    assert [(r["ablation"], r["seed"]) for r in merged][:2] == [("length_norm", 1), ("length_norm", 2)]
    assert len(merged) == 12 and "updated 1 generated blocks" in out
    assert "[report](length_norm_room/report.md)" in (reruns / "README.md").read_text()
    # a committed step from a dirty tree is not done
    _committed_step(reruns, "length_norm", ("per_sequence", "constant"), (1, 2, 3), dirty=True)
    assert reproduce.committed_step(plan[0], reruns) is None
    assert "6 runs committed" in reproduce.committed_step(plan[1], reruns)
    # ... and so is one whose runs trained other samples than the plan's (another rollout batch)
    _committed_step(reruns, "length_norm", ("per_sequence", "constant"), (1, 2, 3), samples=60 * 128)
    assert reproduce.committed_step(plan[0], reruns) is None
    _committed_step(reruns, "length_norm", ("per_sequence", "constant"), (1, 2, 3))
    assert "6 runs committed" in reproduce.committed_step(plan[0], reruns)


def test_reproduce_refuses_a_dirty_tree_unless_told_and_records_the_override(tmp_path, capsys, monkeypatch):
    import ppo.run.provenance
    from ablations import reproduce

    monkeypatch.setattr(ppo.run.provenance, "source_version", lambda: ("d" * 40, True))
    args = ["--out", str(tmp_path / "sw"), "--report-dir", str(tmp_path / "reruns"), "--doc", str(tmp_path / "r.md"),
            "--data", str(tmp_path / "data.csv")]
    assert reproduce.main(args) == 2
    assert "uncommitted changes" in capsys.readouterr().err
    assert not (tmp_path / "sw").exists() and not (tmp_path / "reruns").exists()
    assert reproduce.clean_tree_or_override(True, tmp_path / "reruns")
    recorded = json.loads((tmp_path / "reruns" / "reproduce.json").read_text())
    assert recorded == {"commit": "d" * 40, "dirty": True, "allow_dirty": True}
    monkeypatch.setattr(ppo.run.provenance, "source_version", lambda: ("e" * 40, False))
    assert reproduce.clean_tree_or_override(False, tmp_path / "other")
    assert not (tmp_path / "other").exists()


# Decimal numbers docs/results.md's prose may state without a generated table behind them:
# settings and constants (model size, the 0.03 margin and binomial standard error, lambda
# 0.95 and 1.0, VAPO's alpha and its lambda bound 0.43), and `eos_rate` 1.0 (every response
# stops), which the details sweep's `identical in every pair` rows follow from.
PROSE_SETTINGS = {"0.9", "0.03", "0.95", "1.0", "0.05", "0.43"}


def _prose_without_generated_content(text):
    text = re.sub(r"<!-- generated:(\S+) -->.*?<!-- /generated:\1 -->", "", text, flags=re.S)
    text = re.sub(r"<!-- kl-gradient-study:begin.*?kl-gradient-study:end -->", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)  # code spans: commands, field names
    return re.sub(r"\]\([^)]*\)", "]", text)  # link targets


def test_docs_results_prose_states_only_generated_numbers():
    """A reader of docs/results.md finishes it (at most 380 lines: 355 before the instrument's
    noise table joined it), and every measurement its prose states is one a generated table on
    the page shows, so a rerun cannot leave the prose saying something the data no longer does."""
    text = (ROOT / "docs" / "results.md").read_text()
    assert len(text.splitlines()) <= 380
    generated = "\n".join(doc_blocks.generated_block(text, name) for name in doc_blocks.block_names(text))
    if "kl-gradient-study:begin" in text:
        generated += text[text.index("kl-gradient-study:begin"):]
    prose = _prose_without_generated_content(text)
    stray = [n for n in re.findall(r"(?<![\w.])[-+]?\d+\.\d+", prose)
             if n.lstrip("+-") not in PROSE_SETTINGS and n.lstrip("+-") not in generated]
    assert not stray, f"numbers in docs/results.md's prose that no generated table shows: {stray}"


def test_extras_block_shows_each_metric_at_the_end_and_evaluation_keys_over_the_run():
    """`extras:DIR`: per variant, the metric and every extra metric as mean ± 95% interval over
    seeds, and the whole-run mean (`:all`) beside each held-out evaluation key."""
    from ablations.report_tables import extras_table
    from ablations.registry import get_ablation

    spec = get_ablation("alpacafarm_overoptimization")
    columns = {key: [1.0, 2.0, 3.0] for key in spec.extra_metrics}
    rows = rows_for("alpacafarm_overoptimization", {
        "kl_0.0": {**columns, "eval_gold_reward": [0.1, 0.2, 0.3], "eval_gold_reward:all": [0.3, 0.3, 0.3],
                   "eval_win_rate_vs_sft:all": [0.6, 0.7, 0.8], "eval_proxy_reward:all": [0.5, 0.5, 0.5],
                   "final_sampled_accuracy": [0.4, 0.4, 0.4], "metric_value": [0.1, 0.2, 0.3]}})
    table = extras_table(rows, {"alpacafarm_overoptimization": spec}).splitlines()
    header = table[0]
    assert "`eval_gold_reward` (end)" in header and "`eval_gold_reward` (run mean)" in header
    assert "`score` (end)" in header and "`score` (run mean)" not in header  # a training key: the end only
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in table[2].strip("|").split("|")]))
    # mean 0.2, sd 0.1, t(0.975, 2) = 4.303: half-width 0.1 * 4.303 / sqrt(3) = 0.248
    assert cells["`eval_gold_reward` (end)"] == "0.2 ± 0.248"
    assert cells["`eval_gold_reward` (run mean)"] == "0.3 ± 0"
    assert cells["`eval_win_rate_vs_sft` (run mean)"] == "0.7 ± 0.248"
    assert cells["seeds ok"] == "3/3"


# Blocks read from a sweep committed under docs/results/ (or its saved instrument data): any
# page may hold them, and each must be what its data gives now.
COMMITTED_DATA_BLOCKS = ("extras:", "gains:", "starts:", "pair_noise:", "glance:", "claims:", "budget:", "noise:", "aa:")


def test_committed_data_blocks_of_every_page_are_the_generated_ones():
    """Every block of docs/*.md that reads committed data (`extras:DIR` in alpacafarm.md,
    `pair_noise:DIR` in testbed.md, `noise:NAME` in results.md, ...) is that data's table, regenerated here."""
    found = set()
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        names = [name for name in doc_blocks.block_names(text) if name.startswith(COMMITTED_DATA_BLOCKS)]
        for name, content in doc_tables.generated_tables([], names).items():
            assert doc_blocks.generated_block(text, name) == content, f"{page.name}: {name}"
            found.add(name.split(":", 1)[0] + ":")
    assert {"extras:", "gains:", "pair_noise:", "noise:", "aa:"} <= found


def test_pair_noise_block_matches_hand_computation(tmp_path):
    """pair_noise:DIR on a toy sweep: differences 0.01, 0.03, 0.02 (sd 0.01) -> 5 seeds detect
    (2.776 + 0.941) * 0.01 / sqrt(5) = 0.0166, and 0.025 needs 4 seeds ((3.182 + 0.978) * 0.01 / 2
    = 0.0208; 3 seeds: (4.303 + 1.061) * 0.01 / sqrt(3) = 0.0310); 40 samples over 10 steps is 4 a step."""
    from ablations.noise import pair_noise_table
    from ablations.run_results import AblationSpec

    rows = [{"ablation": "toy", "variant": v, "seed": s, "status": "ok", "final_sampled_accuracy": x,
             "late_sampled_accuracy": x, "samples": 40, "total_steps": 10}
            for s, (a, b) in enumerate([(0.50, 0.51), (0.40, 0.43), (0.45, 0.47)], start=1)
            for v, x in (("a", a), ("b", b))]
    specs = {"toy": AblationSpec("toy", "?", "final_sampled_accuracy", base="a")}
    table = pair_noise_table(rows, specs).splitlines()
    assert table[2] == ("| `toy` | `b` - `a` | 4 | held-out sampled accuracy, final evaluation (as logged) | 3 | "
                        "0.0100 | 0.0166 | 4 |")
    assert len(table) == 4  # the late mean's row beside it
    rows += [{**row, "variant": "c", "samples": 80} for row in rows if row["variant"] == "b"]
    assert "| `toy` | `c` - `a` | 4 / 8 |" in pair_noise_table(rows, specs)  # arms of other batches: both shown
