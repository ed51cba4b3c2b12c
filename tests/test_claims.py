"""Claim verdicts and generated doc tables (ablations/claims.py), on hand-computed numbers.

    first  [0.7, 0.8, 0.9], second [0.5, 0.6, 0.8] -> differences [0.2, 0.2, 0.1]
    mean 0.1667, sd sqrt(((1/30)^2 * 2 + (2/30)^2) / 2) = 0.05774,
    95% half-width 4.303 * 0.05774 / sqrt(3) = 0.1434 (excludes 0: separated),
    detectable (4.303 + 1.061) * 0.05774 / sqrt(3) = 0.1788
"""

from pathlib import Path

import pytest

from ablations import claims
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


def claim(direction, first=("other", "final_sampled_accuracy"), second=("base", "final_sampled_accuracy")):
    return Claim("a claim", "a source", "toy", first, second, direction, "accuracy")


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
    assert evaluate_claim(claim(+1, first, second), ROWS)["verdict"].startswith("not detected at 3 seeds (detectable")
    assert evaluate_claim(claim(0, first, second), ROWS)["verdict"].startswith(
        "consistent: no difference detected at 3 seeds (detectable about")


def test_within_variant_claim_pairs_two_columns_of_one_run():
    # base: kl - kl_k1 = [1.0, 1.0, 0.5]: mean 0.833, sd 0.2887, half-width 0.717 -> separated
    result = evaluate_claim(claim(+1, ("base", "kl"), ("base", "kl_k1")), ROWS)
    assert result["mean"] == pytest.approx(0.8333, abs=1e-4)
    assert result["ci"] == pytest.approx(4.303 * 0.28868 / 3 ** 0.5, abs=1e-3)
    assert result["verdict"] == "reproduced"


def test_missing_ablation_or_single_seed_is_not_tested():
    assert claim_verdict(+1, {"n": 0}) == "not tested: not in this sweep"
    assert evaluate_claim(Claim("c", "s", "absent", ("a", "kl"), ("b", "kl"), 1, "q"), ROWS)["verdict"] == \
        "not tested: not in this sweep"
    one_seed = [r for r in ROWS if r["seed"] == 1]
    assert evaluate_claim(claim(+1), one_seed)["verdict"] == "not tested: fewer than 2 paired seeds"


def test_failed_runs_never_enter_a_claim():
    failed = [{**r, "status": "failed"} if r["variant"] == "other" and r["seed"] == 3 else r for r in ROWS]
    assert evaluate_claim(claim(+1), failed)["n"] == 2


def test_glance_table_has_one_line_per_non_base_variant_with_computed_verdicts():
    table = claims.glance_table(ROWS).splitlines()
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


def test_replace_block_rewrites_only_between_the_markers():
    text = "intro\n<!-- generated:glance -->\nold\n<!-- /generated:glance -->\noutro\n"
    new = claims.replace_block(text, "glance", "| new |")
    assert new == "intro\n<!-- generated:glance -->\n| new |\n<!-- /generated:glance -->\noutro\n"
    assert claims.generated_block(new, "glance") == "| new |"
    with pytest.raises(ValueError, match="generated:claims"):
        claims.replace_block(text, "claims", "x")


def test_cli_update_writes_both_blocks(tmp_path, capsys):
    from ablations.report import _write_csv

    data = tmp_path / "results.csv"
    _write_csv(data, ROWS, ("ablation", "variant", "seed", "status"))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- generated:claims -->\n<!-- /generated:claims -->\n\n"
                   "<!-- generated:glance -->\n<!-- /generated:glance -->\n")
    assert claims.main([str(data)]) == 0 and "| claim (source) |" in capsys.readouterr().out
    assert claims.main([str(data), "--update", str(doc)]) == 0
    text = doc.read_text()
    assert claims.generated_block(text, "glance") == claims.glance_table(ROWS)
    assert "not tested: not in this sweep" in claims.generated_block(text, "claims")
    assert claims.main([str(tmp_path / "missing.csv")]) == 2


def test_docs_results_tables_are_the_generated_ones():
    """docs/results.md's claims and at-a-glance tables say exactly what the committed data says."""
    data = ROOT / "docs" / "results" / "data" / "results.csv"
    text = (ROOT / "docs" / "results.md").read_text()
    rows = claims.read_results(data)
    names = claims.block_names(text)
    assert {"claims", "glance"} <= set(names)
    for name, content in claims.generated_tables(rows, names).items():
        assert claims.generated_block(text, name) == content, name


def test_cli_update_fills_ablation_table_blocks(tmp_path):
    from ablations.report import _write_csv

    data = tmp_path / "results.csv"
    _write_csv(data, ROWS, ("ablation", "variant", "seed", "status"))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- generated:table:toy -->\n<!-- /generated:table:toy -->\n<!-- generated:bogus -->\n"
                   "<!-- /generated:bogus -->\n")
    assert claims.main([str(data), "--update", str(doc)]) == 2  # an unknown block name is refused
    doc.write_text("<!-- generated:table:toy -->\n<!-- /generated:table:toy -->\n")
    assert claims.main([str(data), "--update", str(doc)]) == 0
    block = claims.generated_block(doc.read_text(), "table:toy")
    assert "| other | 3/3 | 0.800 ± 0.248 |" in block  # mean of [0.7, 0.8, 0.9], 4.303 * 0.1 / sqrt(3)
    assert "Paired by seed against `base`" in block and "| other | final_sampled_accuracy | +0.167 ± 0.143 |" in block


def test_pairs_block_compares_with_another_variant():
    """pairs:ABLATION:VARIANT pairs every other variant against VARIANT: here `base` minus
    `other` in accuracy, the hand-computed pair negated (-0.167 ± 0.143)."""
    block = claims.generated_tables(ROWS, ["pairs:toy:other"])["pairs:toy:other"]
    assert "Paired by seed against `other`" in block
    assert "| base | final_sampled_accuracy | -0.167 ± 0.143 | 3 | separated |" in block
    with pytest.raises(ValueError, match="no variant 'missing'"):
        claims.generated_tables(ROWS, ["pairs:toy:missing"])
