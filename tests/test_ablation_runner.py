"""The sweep runner and ``python -m ablations``: skipping, failure isolation, retries, CLI.

Most tests replace `launch_run` with a stand-in that writes what a finished run writes, so
they check the runner's bookkeeping without training. One test launches real ``ppo.cli``
processes: a variant that crashes at start next to a one-step run of the tiny model.
"""

import json
import sys
import types
from pathlib import Path

import pytest
import yaml

import ablations.run_attempt as run_attempt
import ablations.runner as runner
from ablations.__main__ import main
from ablations.registry import ABLATIONS, Ablation, Variant
from ablations.runner import RunOutcome, plan_runs, run_sweep
from ppo.config import PPOConfig

# One GRPO step on the tiny model: a few seconds in a subprocess.
TINY = dict(rollout_batch_size=8, group_size=4, response_length=8, total_steps=1, eval_size=4, eval_every=0)


def tiny_ablation(model_dir, broken=False) -> Ablation:
    variants = [Variant("a", "grpo", {**TINY, "model_path": str(model_dir)}),
                Variant("b", "grpo", {**TINY, "model_path": str(model_dir), "grpo_scale": "none"})]
    if broken:
        variants[0] = Variant("broken", "grpo", {**TINY, "model_path": str(model_dir / "does_not_exist")})
    return Ablation("toy", "Does the runner work?", tuple(variants), metric="accuracy")


def finish(spec, steps=None):
    """Write what a finished run leaves: its config.yaml and a summary of its steps."""
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    spec.config.to_yaml(spec.run_dir / "config.yaml")
    steps = spec.config.total_steps if steps is None else steps
    (spec.run_dir / "summary.json").write_text(json.dumps({"steps": steps, "final_eval": {"sampled_accuracy": 0.5}}))


@pytest.fixture
def fake_launch(monkeypatch):
    """Replace the subprocess launch: record each launch and write what a finished run writes."""
    launches = []

    def launch(spec, resume=False, timeout=None):
        launches.append({"label": spec.label, "resume": resume,
                         "leftovers": sorted(p.name for p in spec.run_dir.iterdir())})
        finish(spec)
        return RunOutcome(spec, "ok", 0, resumed=resume)

    monkeypatch.setattr(run_attempt, "launch_run", launch)
    return launches


def test_plan_runs_layout_and_configs(tmp_path):
    ablation = tiny_ablation(tmp_path)
    specs = plan_runs(ablation, seeds=2, steps=3, sweep_dir=tmp_path / "sweep")
    assert [s.label for s in specs] == ["toy/a/seed1", "toy/a/seed2", "toy/b/seed1", "toy/b/seed2"]
    assert specs[3].run_dir == tmp_path / "sweep" / "toy" / "b" / "seed2"
    assert specs[3].config.seed == 2 and specs[3].config.total_steps == 3
    assert specs[3].config.output_dir == str(specs[3].run_dir) and specs[3].config.grpo_scale == "none"
    with pytest.raises(ValueError, match="seeds"):
        plan_runs(ablation, seeds=0, steps=None, sweep_dir=tmp_path)



def test_plan_runs_first_seed_gives_fresh_seeds(tmp_path):
    """`first_seed` (``run --first-seed``) plans seeds first_seed..first_seed + seeds - 1, each
    run's config and folder carrying its own seed; a seed below 1 is refused."""
    ablation = tiny_ablation(tmp_path)
    specs = plan_runs(ablation, seeds=3, steps=2, sweep_dir=tmp_path / "sweep", first_seed=7)
    assert sorted({spec.seed for spec in specs}) == [7, 8, 9]
    assert all(spec.config.seed == spec.seed and spec.run_dir.name == f"seed{spec.seed}" for spec in specs)
    with pytest.raises(ValueError, match="first_seed"):
        plan_runs(ablation, seeds=1, steps=None, sweep_dir=tmp_path, first_seed=0)

def test_completed_runs_are_skipped(tmp_path, fake_launch):
    sweep = tmp_path / "sweep"
    done = sweep / "toy" / "a" / "seed1"
    finish(plan_runs(tiny_ablation(tmp_path), seeds=1, steps=None, sweep_dir=sweep.absolute())[0])
    (done / "metrics.jsonl").write_text('{"step": 0}\n')

    result = run_sweep([tiny_ablation(tmp_path)], sweep, seeds=2, workers=1, progress=False)
    assert sorted(l["label"] for l in fake_launch) == ["toy/a/seed2", "toy/b/seed1", "toy/b/seed2"]
    assert [o.spec.label for o in result.skipped] == ["toy/a/seed1"]
    assert len(result.completed) == 3 and result.ok
    assert (done / "metrics.jsonl").read_text() == '{"step": 0}\n'  # a complete run is left untouched
    # Each launched run got its config on disk first, with threads = cpu_count // workers.
    written = yaml.safe_load((sweep / "toy" / "b" / "seed2" / "requested_config.yaml").read_text())
    assert written["seed"] == 2 and written["threads"] == max(1, runner.os.cpu_count() or 1)
    recorded = json.loads((sweep / "sweep.json").read_text())
    assert recorded["ablations"] == ["toy"] and recorded["seeds"] == 2 and recorded["steps"] is None
    assert "started" in recorded and "command" in recorded

    fake_launch.clear()
    again = run_sweep([tiny_ablation(tmp_path)], sweep, seeds=2, workers=1, progress=False)
    assert fake_launch == [] and len(again.skipped) == 4


@pytest.mark.parametrize("damage", ["truncated", "empty", "list", "stopped_early", "other_steps"])
def test_a_run_is_complete_only_with_a_valid_summary_of_its_planned_steps(tmp_path, fake_launch, damage):
    """A summary.json that is truncated, empty, [] or of fewer steps, or a run of another
    --steps, is incomplete: rerun (not skipped forever), and the report agrees."""
    from ablations.report import collect_runs

    sweep = tmp_path / "sweep"
    steps = 3
    spec = plan_runs(tiny_ablation(tmp_path), seeds=1, steps=steps, sweep_dir=sweep.absolute())[0]
    finish(spec)
    assert spec.complete
    summary = spec.run_dir / "summary.json"
    if damage == "truncated":
        summary.write_text(summary.read_text()[:15])
    elif damage == "empty":
        summary.write_text("")
    elif damage == "list":
        summary.write_text("[]")
    elif damage == "stopped_early":
        finish(spec, steps=2)
    else:
        steps = 5  # the sweep is rerun with --steps 5: the 3-step result is not its run
    assert not spec.complete or damage == "other_steps"
    result = run_sweep([tiny_ablation(tmp_path)], sweep, seeds=1, steps=steps, workers=1, progress=False)
    assert "toy/a/seed1" in [launch["label"] for launch in fake_launch] and not result.skipped
    row = next(r for r in collect_runs(sweep) if r["variant"] == "a")
    assert row["status"] == "ok" and row["steps"] == steps == row["total_steps"]
    assert json.loads((sweep / "sweep.json").read_text())["steps"] == steps


def test_a_variant_folder_that_links_out_of_the_sweep_is_left_alone(tmp_path, fake_launch):
    """sweep/toy/a/seed1 -> the user's folder: the runner would clear it before training."""
    sweep = tmp_path / "sweep"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("keep")
    (sweep / "toy" / "a").mkdir(parents=True)
    (sweep / "toy" / "a" / "seed1").symlink_to(mine)
    result = run_sweep([tiny_ablation(tmp_path)], sweep, seeds=1, workers=1, progress=False)
    assert [o.spec.label for o in result.failed] == ["toy/a/seed1"]
    assert "leads to" in result.failed[0].error and "through a symbolic link" in result.failed[0].error
    assert [p.name for p in mine.iterdir()] == ["precious.txt"] and (mine / "precious.txt").read_text() == "keep"


def test_threads_can_be_set_for_a_shared_machine(tmp_path, fake_launch):
    sweep = tmp_path / "sweep"
    run_sweep([tiny_ablation(tmp_path)], sweep, seeds=1, workers=1, threads=1, progress=False)
    written = yaml.safe_load((sweep / "toy" / "a" / "seed1" / "requested_config.yaml").read_text())
    assert written["threads"] == 1
    # sweep.json records the threads the runs got, not the backend's default share of the cores
    assert json.loads((sweep / "sweep.json").read_text())["backend"]["threads_per_run"] == 1
    with pytest.raises(ValueError, match="threads"):
        run_sweep([tiny_ablation(tmp_path)], tmp_path / "other", seeds=1, workers=1, threads=0, progress=False)


def test_compile_flag_compiles_every_lean_run_and_resumes_across_it(tmp_path, fake_launch):
    sweep = tmp_path / "sweep"
    run_sweep([tiny_ablation(tmp_path)], sweep, seeds=1, workers=1, threads=1, progress=False, compile_forward=True)
    for variant in ("a", "b"):
        written = yaml.safe_load((sweep / "toy" / variant / "seed1" / "requested_config.yaml").read_text())
        assert written["compile_forward"] is True
    assert json.loads((sweep / "sweep.json").read_text())["compile_forward"] is True
    # A run without the lean forward keeps its module calls (compile_forward would be refused).
    plain = PPOConfig(lean_forward=False)
    assert runner.sweep_config(plain, 2, compile_forward=True).compile_forward is False
    assert runner.sweep_config(PPOConfig(), 2).compile_forward is False
    # A checkpoint written eagerly resumes under --compile: only the rounding differs.
    assert "compile_forward" in runner.RESUME_IGNORED_FIELDS
    assert "compile_forward" not in runner.REUSE_IGNORED_FIELDS


def test_partial_run_is_cleared_or_resumed(tmp_path, fake_launch):
    ablation = tiny_ablation(tmp_path)
    sweep = tmp_path / "sweep"
    specs = {s.label: s for s in plan_runs(ablation, seeds=1, steps=None, sweep_dir=sweep)}
    # toy/a: interrupted before any checkpoint -> cleared (log kept) and started over.
    partial = specs["toy/a/seed1"].run_dir
    partial.mkdir(parents=True)
    for name in ("metrics.jsonl", "samples.jsonl", "config.yaml", "error.txt", "stdout.log"):
        (partial / name).write_text("old\n")
    # toy/b: a complete checkpoint under the same config (threads aside) -> resumed.
    resumable = specs["toy/b/seed1"]
    (resumable.run_dir / "checkpoints" / "step_000001").mkdir(parents=True)
    (resumable.run_dir / "checkpoints" / "step_000001" / "state.json").write_text("{}")
    resumable.config.replace(threads=7).to_yaml(resumable.run_dir / "config.yaml")
    (resumable.run_dir / "metrics.jsonl").write_text('{"step": 0}\n')

    run_sweep([ablation], sweep, seeds=1, workers=1, progress=False)
    launches = {l["label"]: l for l in fake_launch}
    assert launches["toy/a/seed1"] == {"label": "toy/a/seed1", "resume": False,
                                       "leftovers": ["requested_config.yaml", "stdout.log"]}
    assert (partial / "stdout.log").read_text() == "old\n"
    assert launches["toy/b/seed1"]["resume"] is True
    assert "metrics.jsonl" in launches["toy/b/seed1"]["leftovers"]


def test_failed_run_is_recorded_and_the_rest_complete(tmp_path, tiny_model_dir, monkeypatch):
    sweep = tmp_path / "sweep"
    result = run_sweep([tiny_ablation(tiny_model_dir, broken=True)], sweep, seeds=1, workers=2, progress=False)

    assert [o.spec.label for o in result.failed] == ["toy/broken/seed1"]
    assert [o.spec.label for o in result.completed] == ["toy/b/seed1"] and not result.ok
    broken = sweep / "toy" / "broken" / "seed1"
    error = (broken / "error.txt").read_text()
    assert error.startswith("exit code 1: ") and "does_not_exist" in error.splitlines()[0]
    # The stderr tail: ppo-train's one-line message (a user error prints no traceback).
    assert "ppo-train: error: " in error.splitlines()[-1] and "Traceback" not in error
    assert result.failed[0].error == error.splitlines()[0]
    assert "FAILED" in result.summary() and str(broken) in result.summary()
    assert not (broken / "summary.json").exists()
    good = sweep / "toy" / "b" / "seed1"
    rows = [json.loads(line) for line in (good / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and (good / "summary.json").is_file()
    assert "run: " in (good / "stdout.log").read_text()  # the run's stdout went to its log
    assert not (good / "error.txt").exists()
    # Its results.csv row says which code, warm start, libraries, threads and machine made it.
    from ablations.report import collect_runs
    from ppo.run import provenance
    from ppo.models import sft
    row = next(r for r in collect_runs(sweep) if r["variant"] == "b")
    assert all(row[f"prov_{name}"] != "" for name in provenance.FIELDS if name != "reward_model"), row
    assert row["prov_reward_model"] == ""  # no reward model scores this run
    assert row["prov_warm_start"] == sft.weights_sha256(tiny_model_dir)[:16]
    assert row["prov_threads"] == yaml.safe_load((good / "config.yaml").read_text())["threads"]

    # Rerunning retries the failed run only; its error.txt is gone before the new attempt.
    relaunched = []

    def launch(spec, resume=False, timeout=None):
        relaunched.append((spec.label, (spec.run_dir / "error.txt").exists()))
        return RunOutcome(spec, "failed", 1, error="still broken")

    monkeypatch.setattr(run_attempt, "launch_run", launch)
    again = run_sweep([tiny_ablation(tiny_model_dir, broken=True)], sweep, seeds=1, workers=2, progress=False)
    assert relaunched == [("toy/broken/seed1", False)]
    assert [o.spec.label for o in again.skipped] == ["toy/b/seed1"]


def _dup_ablation(name, model_dir, variants=("a", "a_copy", "b")) -> list[Ablation]:
    """Variants named 'a*' share one config; 'b*' and 'c*' differ (grpo_scale none / batch).
    One ablation may not hold two identical arms (`refuse_identical_arms`), so a repeated
    config goes to a second ablation, ``<name>2`` (then ``<name>3``, ...): a sweep of them
    holds identical runs across ablations, which is what reuse copies."""
    def overrides(variant):
        extra = {"b": {"grpo_scale": "none"}, "c": {"grpo_scale": "batch"}}.get(variant[0], {})
        return {**TINY, "model_path": str(model_dir), **extra}
    groups: list[list[str]] = []
    for variant in variants:
        group = next((g for g in groups if all(v[0] != variant[0] for v in g)), None)
        if group is None:
            groups.append(group := [])
        group.append(variant)
    return [Ablation(name if i == 0 else f"{name}{i + 1}", "Are identical runs trained once?",
                     tuple(Variant(v, "grpo", overrides(v)) for v in group), metric="accuracy")
            for i, group in enumerate(groups)]


def test_identical_runs_train_once_and_are_copied(tmp_path, monkeypatch):
    launches = []

    def launch(spec, resume=False, timeout=None):
        launches.append(spec.label)
        spec.config.to_yaml(spec.run_dir / "config.yaml")
        (spec.run_dir / "metrics.jsonl").write_text(f'{{"step": 1, "run": "{spec.label}"}}\n')
        (spec.run_dir / "checkpoints" / "step_000001").mkdir(parents=True)
        finish(spec)
        return RunOutcome(spec, "ok", 0)

    monkeypatch.setattr(run_attempt, "launch_run", launch)
    sweep = tmp_path / "sweep"
    result = run_sweep(_dup_ablation("toy", tmp_path), sweep, seeds=2, workers=2, progress=False)
    # a and a_copy are identical per seed: a trains, a_copy copies it; b trains.
    assert sorted(launches) == ["toy/a/seed1", "toy/a/seed2", "toy/b/seed1", "toy/b/seed2"]
    assert sorted(o.spec.label for o in result.reused) == ["toy2/a_copy/seed1", "toy2/a_copy/seed2"]
    assert result.ok and "2 copied from an identical run" in result.summary()
    copy = sweep / "toy2" / "a_copy" / "seed2"
    assert (copy / "metrics.jsonl").read_text() == (sweep / "toy" / "a" / "seed2" / "metrics.jsonl").read_text()
    assert (copy / "summary.json").is_file() and not (copy / "checkpoints").exists()
    assert (copy / "reused_from.txt").read_text().splitlines()[0] == str((sweep / "toy" / "a" / "seed2").resolve())
    assert yaml.safe_load((copy / "config.yaml").read_text())["output_dir"] == str(copy)
    # The report names the source of each copy.
    from ablations.report import collect_runs
    rows = {(r["variant"], r["seed"]): r for r in collect_runs(sweep)}
    assert rows[("a_copy", 2)]["reused_from"] == "toy/a/seed2" and rows[("a", 2)]["reused_from"] == ""

    # A later sweep of another ablation reuses complete runs of the first one (any ablation);
    # its genuinely new variant trains.
    launches.clear()
    later = run_sweep(_dup_ablation("other", tmp_path, variants=("b_same", "c")), sweep, seeds=1,
                      workers=2, progress=False)
    assert [o.spec.label for o in later.reused] == ["other/b_same/seed1"]
    assert launches == ["other/c/seed1"]
    # A different thread count is a different run (floating-point reductions split differently).
    launches.clear()
    run_sweep(_dup_ablation("threads", tmp_path, variants=("b_same",)), sweep, seeds=1, workers=1,
              progress=False)
    assert launches == (["threads/b_same/seed1"] if (runner.os.cpu_count() or 1) > 1 else [])
    # Two identical pending runs that both match a complete run are both copied.
    launches.clear()
    both = run_sweep(_dup_ablation("fourth", tmp_path, variants=("b_one", "b_two")), sweep, seeds=1,
                     workers=2, progress=False)
    assert launches == [] and sorted(o.spec.label for o in both.reused) == ["fourth/b_one/seed1",
                                                                          "fourth2/b_two/seed1"]
    # With reuse off, every run trains.
    launches.clear()
    run_sweep(_dup_ablation("third", tmp_path, variants=("a", "a_copy")), sweep, seeds=1, workers=1,
              progress=False, reuse=False)
    assert sorted(launches) == ["third/a/seed1", "third2/a_copy/seed1"]
    # A sweep in another directory copies from this one only when told to (`reuse_from`).
    launches.clear()
    elsewhere = tmp_path / "elsewhere"
    run_sweep(_dup_ablation("fifth", tmp_path, variants=("b_again",)), elsewhere / "one", seeds=1, workers=2,
              progress=False)
    assert launches == ["fifth/b_again/seed1"]
    launches.clear()
    told = run_sweep(_dup_ablation("sixth", tmp_path, variants=("b_again",)), elsewhere / "two", seeds=1,
                     workers=2, progress=False, reuse_from=[sweep])
    assert launches == [] and [o.spec.label for o in told.reused] == ["sixth/b_again/seed1"]
    assert (elsewhere / "two" / "sixth" / "b_again" / "seed1" / "reused_from.txt").read_text().startswith(str(sweep))
    from ablations.report import collect_runs
    (source,) = [r["reused_from"] for r in collect_runs(elsewhere / "two")]  # relative: no machine's path
    assert source.startswith("../../sweep/") and (elsewhere / "two" / source / "summary.json").is_file()


def test_identical_run_trains_itself_when_its_leader_fails(tmp_path, monkeypatch):
    launches = []

    def launch(spec, resume=False, timeout=None):
        launches.append(spec.label)
        if spec.variant == "a":
            return RunOutcome(spec, "failed", 1, error="boom")
        finish(spec)
        return RunOutcome(spec, "ok", 0)

    monkeypatch.setattr(run_attempt, "launch_run", launch)
    result = run_sweep(_dup_ablation("toy", tmp_path, variants=("a", "a_copy")), tmp_path / "sweep",
                       seeds=1, workers=1, progress=False)
    assert launches == ["toy/a/seed1", "toy2/a_copy/seed1"]
    assert [o.spec.label for o in result.failed] == ["toy/a/seed1"]
    assert [o.spec.label for o in result.completed] == ["toy2/a_copy/seed1"] and not result.reused


# ---------------------------------------------------------------------------------- the CLI
def test_list_prints_every_registered_ablation(capsys):
    assert main(["list"]) == 0
    from ablations.registry import DATA_PARALLEL_ONLY

    out = capsys.readouterr().out
    lines, _, tail = out.partition("\n\n")
    lines = lines.splitlines()
    assert len(lines) == len(ABLATIONS)
    # the toggles no one-process sweep can show, each named with the test that shows it instead
    assert [line.split(":")[0].strip() for line in tail.splitlines()[1:]] == list(DATA_PARALLEL_ONLY)
    for line, (name, ablation) in zip(lines, ABLATIONS.items()):
        assert line.split()[0] == name and line.endswith(ablation.question)
        assert f"{len(ablation.variants)} variant" in line
    # Aligned: every question starts in the same column.
    assert len({line.index(ablation.question) for line, ablation in zip(lines, ABLATIONS.values())}) == 1


def test_unknown_ablation_exits_2_listing_known_names(capsys, monkeypatch):
    monkeypatch.setattr(runner, "run_sweep", lambda *a, **k: pytest.fail("must not start a sweep"))
    assert main(["run", next(iter(ABLATIONS)), "no_such_ablation", "--seeds", "1"]) == 2
    message = capsys.readouterr().err
    assert "no_such_ablation" in message
    for name in ABLATIONS:
        assert name in message


def test_run_command_sweeps_then_reports(tmp_path, capsys, monkeypatch):
    calls = {}

    def fake_sweep(ablations, sweep_dir, **kwargs):
        calls.update(names=[a.name for a in ablations], sweep_dir=Path(sweep_dir), **kwargs)
        return runner.SweepResult(Path(sweep_dir), [RunOutcome(None, "ok")])

    def build_report(sweep_dir, allow_mixed=False):
        Path(sweep_dir).mkdir(parents=True, exist_ok=True)
        (Path(sweep_dir) / "report.md").write_text("# report\n")
        return Path(sweep_dir) / "report.md"

    report = types.SimpleNamespace(build_report=build_report, format_table=lambda d: "| variant | accuracy |",
                                   collect_runs=lambda d: [], pooled_provenance=lambda rows, allow: "Pooled 0 ok runs",
                                   missing_planned_runs=lambda d, rows: [])
    monkeypatch.setattr(runner, "run_sweep", fake_sweep)
    monkeypatch.setitem(sys.modules, "ablations.report", report)
    monkeypatch.chdir(tmp_path)
    name = next(iter(ABLATIONS))
    assert main(["run", name, "--seeds", "2", "--steps", "5", "--workers", "2"]) == 0
    assert calls["names"] == [name] and calls["sweep_dir"] == Path("sweeps") / name
    assert (calls["seeds"], calls["steps"], calls["workers"]) == (2, 5, 2) and calls["reuse"] is True
    assert calls["threads"] is None
    assert main(["run", name, "--workers", "1", "--threads", "1"]) == 0 and calls["threads"] == 1
    out = capsys.readouterr().out
    assert "| variant | accuracy |" in out
    assert str(Path("sweeps") / name / "report.md") in out and str(Path("sweeps") / name / "plots") in out
    assert main(["run", name, "--no-reuse"]) == 0 and calls["reuse"] is False
    assert calls["compile_forward"] is False
    assert main(["run", name, "--compile"]) == 0 and calls["compile_forward"] is True
    assert calls["report_to"] is None  # each run keeps its own report_to
    assert main(["run", name, "--report-to", "mlflow,wandb", "trackio"]) == 0
    assert calls["report_to"] == ["mlflow", "wandb", "trackio"]


def test_report_command_needs_an_existing_directory(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


def test_variants_option_keeps_the_base_and_refuses_unknown_names(tmp_path, capsys, monkeypatch):
    seen = {}

    def fake_sweep(ablations, sweep_dir, **kwargs):
        seen["variants"] = {a.name: [v.name for v in a.variants] for a in ablations}
        return runner.SweepResult(Path(sweep_dir), [RunOutcome(None, "ok")])

    report = types.SimpleNamespace(build_report=lambda d, allow_mixed=False: Path(d) / "report.md",
                                   format_table=lambda d: "", collect_runs=lambda d: [],
                                   pooled_provenance=lambda rows, allow: "", missing_planned_runs=lambda d, rows: [])
    monkeypatch.setattr(runner, "run_sweep", fake_sweep)
    monkeypatch.setitem(sys.modules, "ablations.report", report)
    monkeypatch.chdir(tmp_path)
    # whitening: both (base), rewards_only, advantages_only, neither; gamma_lambda has none of them
    assert main(["run", "whitening", "gamma_lambda", "--variants", "neither"]) == 0
    assert seen["variants"] == {"whitening": ["both", "neither"], "gamma_lambda": ["g1_l1"]}
    seen.clear()
    assert main(["run", "whitening", "--variants", "nither"]) == 2
    assert "nither" in capsys.readouterr().err and not seen


def test_select_variants_keeps_only_the_claims_its_variants_can_test(tmp_path):
    """`run staleness --variants stale_4 stale_4_dppo_tv` runs the base, stale_4 and the DPPO arm;
    it keeps the two claims of the lag (stale_4 against the base) and the DPPO one, and drops
    those on corrections it does not run, so the definition it stores reads back."""
    from ablations.ablation_files import read_stored, store_definitions
    from ablations.registry import get_ablation
    from ablations.sweep_plan import select_variants

    full = get_ablation("staleness")
    (chosen,) = select_variants([full], ["stale_4", "stale_4_dppo_tv"])
    assert [v.name for v in chosen.variants] == ["on_policy", "stale_4", "stale_4_dppo_tv"]
    kept = {c.first[0] for c in chosen.claims}
    assert kept == {"stale_4", "stale_4_dppo_tv"} and len(chosen.claims) == 3 < len(full.claims)
    store_definitions(tmp_path, [chosen])
    assert [c.first for c in read_stored(tmp_path, "staleness").claims] == [c.first for c in chosen.claims]


def test_a_variants_sweep_into_a_full_sweep_keeps_its_stored_claims(tmp_path):
    """A sweep of all of staleness, then one of two of its corrections into the same directory:
    the stored definition keeps every variant and every claim (the claims on corrections the
    second sweep did not run included), so `claims` on the directory still tests them all."""
    from ablations.ablation_files import read_stored, store_definitions
    from ablations.registry import get_ablation
    from ablations.sweep_plan import select_variants

    full = get_ablation("staleness")
    store_definitions(tmp_path, [full])
    (chosen,) = select_variants([full], ["stale_4", "stale_4_dppo_tv"])
    stored = store_definitions(tmp_path, [chosen])[0]
    assert read_stored(tmp_path, "staleness") == stored
    assert {v.name for v in stored.variants} == {v.name for v in full.variants}
    assert sorted((c.first, c.second) for c in stored.claims) == sorted((c.first, c.second) for c in full.claims)
