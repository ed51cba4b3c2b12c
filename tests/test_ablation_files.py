"""Ablation files: one's own ablation from YAML or TOML, run, reported and tested as a built-in.

Covers the file format (`ablations.ablation_files`), grids, the definition a sweep stores and
the report and claims reading it, the did-you-mean refusals of files, ``--set`` and flags,
an unusable ``--out``, and Ctrl-C in ``ppo-train``. Two tests launch real runs of the tiny
model (one step each); the grid's is marked slow.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ablations import registry
from ablations.__main__ import main as ablations_main
from ablations.ablation_files import (AblationFileError, definition, load_ablation_file, parse_definition,
                                      read_stored, store_definitions)
from ablations.claims import claims_table, sweep_claims
from ablations.report import build_report, collect_runs
from ablations.report_tables import _ablation_table
from ablations.run_results import sweep_specs
from ablations.variant_comparison import summarise

REPO = Path(__file__).resolve().parent.parent
# One GRPO step of the tiny model per run (a few seconds each).
TINY = dict(rollout_batch_size=8, group_size=4, response_length=8, eval_size=4, eval_every=0)

# The form the documentation promises, base listed second: neither "the first variant" nor
# "the first by name" would pick it, so a report against k3 can only come from the file.
ISSUE_FORM = """\
name: my_kl
question: Does the KL estimator matter at beta 0.04?
preset: grpo
testbed: true
base: k3
metric: final_sampled_accuracy
variants:
  k1: {kl_estimator: k1}
  k3: {kl_estimator: k3}
"""


# Whatever a test registers from its files is gone after it: the shared table is restored.
pytestmark = pytest.mark.usefixtures("restored_registry")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def tiny_file(tmp_path: Path, model_dir: Path, text: str = ISSUE_FORM, name: str = "my_kl.yaml") -> Path:
    """`text` with the tiny model's sizes and one step added (`overrides` and `steps`)."""
    data = yaml.safe_load(text)
    data.setdefault("overrides", {}).update(TINY, model_path=str(model_dir))
    data["steps"] = 1
    return write(tmp_path / name, yaml.safe_dump(data, sort_keys=False))


# ---------------------------------------------------------------------------------- the format
def test_issue_form_parses_with_the_named_base_first():
    kwargs = parse_definition(yaml.safe_load(ISSUE_FORM), "my.yaml")
    assert [v.name for v in kwargs["variants"]] == ["k3", "k1"]
    assert [v.overrides for v in kwargs["variants"]] == [{"kl_estimator": "k3"}, {"kl_estimator": "k1"}]
    assert {v.preset for v in kwargs["variants"]} == {"grpo"}
    assert (kwargs["metric"], kwargs["testbed"], kwargs["steps"], kwargs["seeds"]) == (
        "final_sampled_accuracy", True, None, None)


def test_grid_cells_are_the_product_named_from_their_values():
    data = {"name": "g", "question": "q?", "preset": "grpo", "metric": "accuracy", "overrides": {"kl_coef": 0.04},
            "variants": {"plain": {}},
            "grid": {"kl_coef": [0.0, 0.01, 0.05], "kl_estimator": ["k1", "k3"]}}
    variants = parse_definition(data, "g.yaml")["variants"]
    assert [v.name for v in variants] == ["plain", "0-k1", "0-k3", "0.01-k1", "0.01-k3", "0.05-k1", "0.05-k3"]
    # a grid value overrides the common overrides; the explicit variant keeps them
    assert variants[0].overrides == {"kl_coef": 0.04}
    assert variants[4].overrides == {"kl_coef": 0.01, "kl_estimator": "k3"}
    # a list of grids: each expands on its own; a preset axis picks each cell's preset
    data["grid"] = [{"kl_estimator": ["k1", "k2"]}, {"preset": ["grpo", "dr_grpo"], "lr": [1e-5]}]
    variants = parse_definition(data, "g.yaml")["variants"]
    assert [(v.name, v.preset) for v in variants] == [
        ("plain", "grpo"), ("k1", "grpo"), ("k2", "grpo"), ("grpo-1e-05", "grpo"), ("dr_grpo-1e-05", "dr_grpo")]


@pytest.mark.parametrize("change, message", [
    ({"metrc": "accuracy"}, "unknown field 'metrc' (did you mean 'metric'?)"),
    ({"variants": {"k3": {"kl_estimater": "k3"}, "k1": {}}},
     "variants.k3: unknown PPOConfig field 'kl_estimater' (did you mean 'kl_estimator'?)"),
    ({"grid": {"kl_cof": [0.0, 0.1]}}, "grid: unknown PPOConfig field 'kl_cof' (did you mean 'kl_coef'?)"),
    ({"preset": "grop"}, "unknown preset 'grop' (did you mean 'grpo'?)"),
    ({"base": "k33"}, "base: no variant 'k33' (did you mean 'k3'?)"),
    ({"variants": {"k3": {"kl_estimator": "k9"}, "k1": {}}}, "variant 'k3': "),
    ({"variants": {"k3": {"seed": 4}, "k1": {}}}, "'seed' cannot be set here"),
    ({"variants": {"../up": {}, "k1": {}}}, "is not a plain name"),
    ({"variants": {"only": {}}}, "at least two variants"),
    ({"steps": 0}, "steps: a positive integer"),
    ({"testbed": "yes"}, "testbed: true or false"),
    ({"question": ""}, "question: the question the ablation answers"),
    ({"claims": [{"claim": "x", "first": "k1", "quantity": "kl_k", "direction": "larger"}]},
     "claims[1].quantity: 'kl_k' is not a column of the results (did you mean 'kl_k1'?)"),
    ({"claims": [{"claim": "x", "frist": "k1"}]}, "claims[1]: unknown claim field 'frist' (did you mean 'first'?)"),
    ({"claims": [{"claim": "x", "first": "k1", "quantity": "kl", "direction": "bigger"}]},
     "direction: larger, smaller or equal"),
])
def test_a_bad_file_is_refused_naming_the_file_and_field(tmp_path, change, message):
    data = {**yaml.safe_load(ISSUE_FORM), **change}
    path = write(tmp_path / "bad.yaml", yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(AblationFileError) as error:
        load_ablation_file(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)
    assert "my_kl" not in registry.ABLATIONS  # refused before anything was registered


def test_unreadable_files_name_themselves(tmp_path):
    with pytest.raises(AblationFileError, match="no such ablation file"):
        load_ablation_file(tmp_path / "missing.yaml")
    twice = write(tmp_path / "twice.yaml", ISSUE_FORM + "metric: accuracy\n")
    with pytest.raises(AblationFileError, match="'metric' is set twice"):
        load_ablation_file(twice)
    with pytest.raises(AblationFileError, match="not valid TOML"):
        load_ablation_file(write(tmp_path / "bad.toml", "name = \n"))


def test_toml_file_equals_its_yaml_twin(tmp_path):
    toml = write(tmp_path / "my_kl.toml", """\
name = "my_kl"
question = "Does the KL estimator matter at beta 0.04?"
preset = "grpo"
testbed = true
base = "k3"
metric = "final_sampled_accuracy"
[variants.k1]
kl_estimator = "k1"
[variants.k3]
kl_estimator = "k3"
""")
    from_toml = load_ablation_file(toml)
    assert from_toml == registry.Ablation(**parse_definition(yaml.safe_load(ISSUE_FORM), "y"))
    assert load_ablation_file(toml) is from_toml  # the same file twice: registered once


def test_a_file_cannot_take_a_registered_name(tmp_path):
    path = write(tmp_path / "quick.yaml", ISSUE_FORM.replace("name: my_kl", "name: quick"))
    with pytest.raises(AblationFileError, match="'quick' is already taken by a registered ablation"):
        load_ablation_file(path)


def test_every_builtin_ablation_is_expressible_as_a_file():
    for ablation in registry.ABLATIONS.values():
        data = yaml.safe_load(yaml.safe_dump(definition(ablation), sort_keys=False))
        assert registry.Ablation(**parse_definition(data, ablation.name)) == ablation, ablation.name


# ---------------------------------------------------------------------------------- the stored definition
def test_sweep_refuses_a_changed_definition_and_keeps_variants_run_before(tmp_path):
    first = load_ablation_file(write(tmp_path / "a.yaml", ISSUE_FORM))
    store_definitions(tmp_path / "sweep", [first])
    assert read_stored(tmp_path / "sweep", "my_kl") == first
    registry.ABLATIONS.pop("my_kl")
    changed = load_ablation_file(write(tmp_path / "b.yaml", ISSUE_FORM.replace("base: k3", "base: k1")))
    with pytest.raises(AblationFileError, match=r"another definition \(base 'k3' -> 'k1'\)"):
        store_definitions(tmp_path / "sweep", [changed])
    registry.ABLATIONS.pop("my_kl")
    fewer = load_ablation_file(write(tmp_path / "c.yaml", ISSUE_FORM.replace("  k1: {kl_estimator: k1}\n",
                                                                              "  k2: {kl_estimator: k2}\n")))
    stored = store_definitions(tmp_path / "sweep", [fewer])[0]
    assert [v.name for v in stored.variants] == ["k3", "k2", "k1"]  # k1's runs are still in the sweep


def _fake_sweep(sweep: Path, ablation: str, accuracy: dict[str, list[float]]) -> None:
    """Finished runs with the given final sampled accuracy per variant and seed."""
    for variant, values in accuracy.items():
        for seed, value in enumerate(values, start=1):
            run = sweep / ablation / variant / f"seed{seed}"
            run.mkdir(parents=True)
            (run / "config.yaml").write_text("total_steps: 1\n")
            (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "kl": 0.1, "kl_k1": 0.2}) + "\n")
            (run / "summary.json").write_text(json.dumps(
                {"steps": 1, "initial_eval": {"sampled_accuracy": 0.5}, "final_eval": {"sampled_accuracy": value}}))


def test_report_and_claims_read_base_metric_and_claims_from_the_sweep(tmp_path):
    """No registry entry: everything comes from the stored definition."""
    text = ISSUE_FORM + ("claims:\n  - claim: k1 is less accurate than k3\n    first: k1\n"
                         "    quantity: final_sampled_accuracy\n    direction: smaller\n")
    store_definitions(tmp_path / "sweep", [load_ablation_file(write(tmp_path / "my.yaml", text))])
    registry.ABLATIONS.pop("my_kl")
    # k1 - k3 per seed: -0.1, -0.2, -0.1 -> mean -0.133, sd 0.0577, half-width 4.303 * 0.0577 / sqrt 3 = 0.143
    _fake_sweep(tmp_path / "sweep", "my_kl", {"k1": [0.5, 0.4, 0.6], "k3": [0.6, 0.6, 0.7]})
    report = build_report(tmp_path / "sweep").read_text()
    assert "Paired by seed against `k3`" in report
    assert "Metric: `final_sampled_accuracy`. Base: `k3`. Definition stored with the sweep" in report
    assert "| k1 | `final_sampled_accuracy` | -0.133 ± 0.143 | 3 |" in report
    rows = collect_runs(tmp_path / "sweep")
    assert {r["metric_value"] for r in rows} == {r["final_sampled_accuracy"] for r in rows}
    specs = sweep_specs(tmp_path / "sweep", ["my_kl"])
    table = claims_table(rows, sweep_claims(specs))
    line = next(line for line in table.splitlines() if line.startswith("| k1 is less accurate"))
    assert "`k1` - `k3` in `final_sampled_accuracy`" in line and "-0.133 ± 0.143" in line


def test_report_names_a_sweep_without_definition_and_the_fallback_it_used(tmp_path):
    _fake_sweep(tmp_path / "sweep", "nobody_knows", {"b": [0.5], "a": [0.6]})
    report = build_report(tmp_path / "sweep").read_text()
    assert ("No definition: `nobody_knows` is neither stored with this sweep nor registered, so the metric is the "
            "default `eval_sampled_accuracy` and every variant is paired with `a`, the first by name.") in report


def test_a_base_without_finished_runs_is_never_replaced(tmp_path):
    store_definitions(tmp_path / "sweep", [load_ablation_file(write(tmp_path / "my.yaml", ISSUE_FORM))])
    _fake_sweep(tmp_path / "sweep", "my_kl", {"k1": [0.5, 0.4, 0.6]})
    report = build_report(tmp_path / "sweep").read_text()
    assert "No paired table: the base variant `k3` has no finished run." in report
    assert "Paired by seed" not in report


def test_one_kl_column_each_clearly_labelled():
    rows = [{"ablation": "x", "variant": "a", "seed": 1, "status": "ok", "kl": 0.5, "kl_k1": 0.25,
             "metric": "kl", "metric_value": 0.5, "samples": 8}]
    specs = {"x": registry.Ablation("x", "q", (registry.Variant("a", "grpo"),), metric="kl")}
    from ablations.run_results import _spec_of

    header = _ablation_table(summarise(rows, {"x": _spec_of(specs["x"], "sweep")})).splitlines()[0]
    assert header.count("KL") == 2 and "KL in use (`kl`) (metric)" in header and "true KL (`kl_k1`)" in header
    assert "`kl` |" not in header.replace("(`kl`) (metric) |", "")  # no second column for the metric


# ---------------------------------------------------------------------------------- the command line
def test_run_command_takes_a_file_and_continues_its_sweep_by_name(tmp_path, monkeypatch):
    import ablations.runner as runner

    seen = []

    def fake_sweep(ablations, sweep_dir, **kwargs):
        seen.append(([a.name for a in ablations], Path(sweep_dir), kwargs["seeds"]))
        store_definitions(sweep_dir, ablations)
        return runner.SweepResult(Path(sweep_dir), [])

    monkeypatch.setattr(runner, "run_sweep", fake_sweep)
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "my_kl.yaml", ISSUE_FORM)
    assert ablations_main(["run", "my_kl.yaml"]) == 1  # nothing completed (the fake ran nothing)
    assert seen[-1] == (["my_kl"], Path("sweeps") / "my_kl", None)
    registry.ABLATIONS.pop("my_kl")
    assert ablations_main(["run", "my_kl", "--seeds", "2"]) == 1  # found in sweeps/my_kl/my_kl/ablation.yaml
    assert seen[-1] == (["my_kl"], Path("sweeps") / "my_kl", 2)


def test_misspelled_names_and_flags_get_a_suggestion(capsys):
    from ppo.cli import main as train_main

    assert ablations_main(["run", "kl_clip_at_zer0"]) == 2
    assert "kl_clip_at_zer0 (did you mean 'kl_clip_at_zero'?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ablations_main(["run", "quick", "--seedz", "2"])
    assert "--seedz: did you mean --seeds?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_main(["--preset", "grpo", "--kl-clip-at-zer0", "true"])
    assert "--kl-clip-at-zer0: did you mean --kl-clip-at-zero?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_main(["--preset", "grpo", "--set", "whiten_reward=false"])
    assert "unknown field 'whiten_reward' (did you mean 'whiten_rewards'?)" in capsys.readouterr().err
    from ppo.config import PPOConfig

    with pytest.raises(ValueError, match=r"unknown field\(s\) \['kl_coeff'\] \(did you mean 'kl_coef'\?\)"):
        PPOConfig.from_dict({"kl_coeff": 0.1})


@pytest.mark.parametrize("out", ["/proc/sweepx", "a_file"])
def test_unusable_out_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys, out):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "a_file", "")
    assert ablations_main(["run", "quick", "--out", out, "--workers", "1", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"run: --out {out if out.startswith('/') else tmp_path / out}: ") and "Traceback" not in err
    assert (tmp_path / "a_file").read_text() == ""  # nothing written over it


# ---------------------------------------------------------------------------------- real runs
def test_issue_form_file_runs_end_to_end_and_reports_against_its_base(tmp_path, tiny_model_dir, monkeypatch, capsys):
    path = tiny_file(tmp_path, tiny_model_dir)
    sweep = tmp_path / "sweep"
    assert ablations_main(["run", str(path), "--seeds", "1", "--workers", "2", "--threads", "1",
                           "--out", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "Paired by seed against `k3`" in out and "final sampled acc (metric)" in out
    assert yaml.safe_load((sweep / "my_kl" / "ablation.yaml").read_text())["base"] == "k3"
    recorded = json.loads((sweep / "sweep.json").read_text())["backend"]["threads_per_run"]
    provenance = {json.loads(p.read_text())["provenance"]["threads"] for p in sweep.glob("my_kl/*/seed1/summary.json")}
    assert provenance == {recorded} == {1}
    # report in a process that has never seen the file: the sweep's definition alone
    registry.ABLATIONS.pop("my_kl")
    assert ablations_main(["report", str(sweep)]) == 0
    report = (sweep / "report.md").read_text()
    assert "Paired by seed against `k3`" in report and "Metric: `final_sampled_accuracy`. Base: `k3`." in report


@pytest.mark.slow
def test_grid_file_runs_end_to_end(tmp_path, tiny_model_dir, capsys):
    text = ("name: my_grid\nquestion: Scale and estimator together?\npreset: grpo\nmetric: kl_k1\n"
            "extra_metrics: [entropy]\ngrid:\n  grpo_scale: [group, none]\n  kl_estimator: [k1, k3]\n"
            "claims:\n  - claim: The estimator leaves the true KL alone\n    first: group-k3\n    quantity: kl_k1\n"
            "    direction: equal\n    margin: 0.5\n    seeds: [1]\n")
    sweep = tmp_path / "sweep"
    assert ablations_main(["run", str(tiny_file(tmp_path, tiny_model_dir, text, "grid.yaml")), "--seeds", "1",
                           "--workers", "2", "--threads", "1", "--out", str(sweep)]) == 0
    assert sorted(p.name for p in (sweep / "my_grid").iterdir() if p.is_dir()) == [
        "group-k1", "group-k3", "none-k1", "none-k3"]
    assert "Paired by seed against `group-k1`" in capsys.readouterr().out
    assert ablations_main(["claims", str(sweep)]) == 0
    assert "The estimator leaves the true KL alone" in capsys.readouterr().out


def test_ctrl_c_in_ppo_train_prints_the_resume_line(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    command = [sys.executable, "-m", "ppo.cli", "--preset", "grpo", "--testbed", "--model-path", str(tiny_model_dir),
               *(f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()), "--save-every", "1",
               "--total-steps", "100000", "--threads", "1", "--progress", "false", "--output-dir", str(run)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("PPO_TRACEBACK", None)
    # A pytest-xdist worker runs with SIGINT ignored, and a child inherits that (Python then
    # raises no KeyboardInterrupt at all): the run gets Ctrl-C's default disposition back, as
    # in a terminal.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # Generous limits: under `make test` the run shares 2 cores with another pytest worker
        # (a 60 s limit once ran out there), and the signal must arrive after the first checkpoint.
        deadline = time.monotonic() + 300
        while not list(run.glob("checkpoints/step_*/state.json")) and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()[1]
            time.sleep(0.2)
        assert list(run.glob("checkpoints/step_*/state.json")), "no checkpoint within 300 s"
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail("ppo-train still running 300 s after Ctrl-C; its stderr ends:\n" + process.communicate()[1][-3000:])
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("ppo-train: interrupted; last checkpoint ")
    assert line.endswith(f"resume with: python -m ppo.cli --output-dir {run} --resume")
    named = Path(line.split("last checkpoint ", 1)[1].split(";", 1)[0])
    assert named.parent == run / "checkpoints" and (named / "state.json").is_file()


def test_the_documented_example_file_loads():
    """docs/sweeps.md's worked file: three variants, k3 the base, two registered claims."""
    ablation = load_ablation_file(REPO / "docs" / "examples" / "my_kl.yaml")
    assert [v.name for v in ablation.variants] == ["k3", "k1", "k2"] and ablation.seeds == 3
    assert [(c.first, c.direction, c.seeds) for c in ablation.claims] == [
        (("k1", "kl_k1"), 1, (1, 2, 3)), (("k1", "final_sampled_accuracy"), 0, (1, 2, 3))]
