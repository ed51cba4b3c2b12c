"""Paths as the filesystem sees them, checkpoints that prove what they are, finished runs.

A run directory is resolved once (``realpath``): a relative spelling, a trailing ``/``, ``.``
or a symbolic link name one directory, one lock and one manifest, and ``--restart`` removes
only files inside it whatever its manifest says. Checkpoints carry digests of their files
and their run's identity: a flipped byte is named and the previous checkpoint loads, another
run's checkpoint is refused. A finished run stays as it is on resume. docs/reliability.md
lists each case with its test (X).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch

from ppo.run import checkpoints, run_dir, run_lock
from ppo.cli import main
from ppo.config import PPOConfig
from ppo.run.run_dir import RunDirectoryError
from ppo.trainer import RLTrainer

from test_reliability import TINY, copy_run, finished_run, resume  # noqa: F401
from test_run_directory import CLI_TINY


def _files(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------- one directory, one spelling
def test_restart_through_another_spelling_leaves_only_the_new_run(tmp_path, tiny_model_dir, monkeypatch):
    """A run written through a relative --output-dir, restarted through its absolute path with a
    trailing '/', resumed through './...': the restart removes every file of the old run (its
    manifest lists them relative to the run), and the resume continues the new run."""
    monkeypatch.chdir(tmp_path)
    base = ["--model-path", str(tiny_model_dir), *CLI_TINY, "--save-every", "1"]
    assert main([*base, "--output-dir", "runs/rel1", "--total-steps", "2"]) == 0
    run = tmp_path / "runs" / "rel1"
    listed = run_dir.written_files(run)
    assert "checkpoints/step_000002/policy/model.safetensors" in listed
    assert not [name for name in listed if name.startswith("runs")]
    assert main([*base, "--output-dir", f"{run}/", "--seed", "5", "--restart", "--total-steps", "1"]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001"]
    assert len(list(run.glob("events.out.tfevents.*"))) == 1  # the old run's event file is gone
    assert main([*base, "--output-dir", "./runs/rel1", "--seed", "5", "--resume", "--total-steps", "3"]) == 0
    assert _steps(run) == [0, 1, 2, 3]
    history = [json.loads(line) for line in (run / "resume_history.jsonl").read_text().splitlines()]
    assert [entry["resumed_at_step"] for entry in history] == [1]
    assert PPOConfig.from_yaml(run / "config.yaml").seed == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"] and not (run / "runs").exists()


def test_dot_as_output_dir_is_the_directory_itself(tmp_path, tiny_model_dir, monkeypatch):
    """'.' in an empty directory starts a run there; its lock lies beside it, not inside it."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    config = PPOConfig(model_path=str(tiny_model_dir), output_dir=".", **TINY)
    trainer = RLTrainer(config)
    assert trainer.output_dir == here
    trainer.train(stop_after=1)
    assert not list(here.glob("*.lock")) and _steps(here) == [0, 1]
    assert run_lock.RunLock(".").path == tmp_path / ".here.lock"


def test_an_old_manifest_spelled_from_the_working_directory_is_read_inside_the_run(tmp_path):
    run = tmp_path / "runs" / "rel1"
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "checkpoints" / "step_000001" / "state.json").write_text("{}")
    (run / "config.yaml").write_text("seed: 0\n")
    (run / run_dir.MANIFEST).write_text("run_files.txt\nruns/rel1/config.yaml\n"
                                        "runs/rel1/checkpoints/step_000001/state.json\n")
    removed = run_dir.clear_outputs(run)
    assert sorted(str(p.relative_to(run)) for p in removed) == [
        "checkpoints/step_000001/state.json", "config.yaml", "run_files.txt"]
    assert list(run.iterdir()) == []


# ------------------------------------------------------------------- nothing outside the run directory
def test_restart_never_removes_what_an_edited_manifest_names_outside_the_run(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    victim, absolute = tmp_path / "victim.txt", tmp_path / "absolute.txt"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for path in (victim, absolute, elsewhere / "precious.txt"):
        path.write_text("keep")
    (run / "linked").symlink_to(elsewhere)
    (run / "config.yaml").write_text("seed: 1\n")
    (run / "checkpoints" / "weights.bin").write_text("the run's")
    (run / run_dir.MANIFEST).write_text(f"run_files.txt\nconfig.yaml\n../victim.txt\n{absolute}\n"
                                        "linked/precious.txt\ncheckpoints/../../victim.txt\ncheckpoints/weights.bin\n")
    with pytest.warns(UserWarning, match=r"left alone 4 listed path\(s\) outside the run directory or behind a "
                                         r"symbolic link \(\.\./victim.txt, .*absolute.txt, linked/precious.txt"):
        removed = run_dir.clear_outputs(run)
    assert sorted(str(p.relative_to(run)) for p in removed) == ["checkpoints/weights.bin", "config.yaml",
                                                                "run_files.txt"]
    assert victim.read_text() == absolute.read_text() == (elsewhere / "precious.txt").read_text() == "keep"
    with pytest.raises(RunDirectoryError, match="outside the run directory"):
        run_dir.record_written(run, tmp_path / "victim.txt")


def test_a_garbage_manifest_is_named_and_nothing_is_removed(finished_run, tmp_path, capsys):
    run, config, _ = copy_run(finished_run, tmp_path)
    (run / run_dir.MANIFEST).write_bytes(b"config.yaml\n\xb2\xff garbage\n")
    before = _files(run)
    with pytest.raises(RunDirectoryError, match=r"run_files.txt: not a manifest this project wrote \(byte 12 is not "
                                                r"UTF-8 text\).*nothing was removed.*Restore it, or delete it"):
        RLTrainer(config).train(restart=True)
    assert _files(run) == before


# --------------------------------------------------------------------------------- lock files
def test_a_refused_directory_keeps_no_lock_file_beside_it(tmp_path, tiny_model_dir):
    """A home directory (any folder of other files), refused as a fresh start or a resume,
    and the filesystem root: no '.home.lock' or '/..lock' is left behind."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("mine")
    trainer = RLTrainer(PPOConfig(model_path=str(tiny_model_dir), output_dir=str(home), **TINY))
    for kwargs in ({}, {"resume": True}, {"restart": True}):
        with pytest.raises(RunDirectoryError, match=r"home: not empty and not a run of this project \(it holds "
                                                    r"\.bashrc\)"):
            trainer.train(**kwargs)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]
    root_lock = Path("/..lock")
    existed = root_lock.exists()
    trainer.output_dir = run_dir.resolve("/")
    with pytest.raises(RunDirectoryError, match=r"^/: not empty and not a run"):
        trainer.train()
    assert root_lock.exists() == existed


def test_a_lock_file_that_cannot_be_made_names_the_folder_it_lives_in(tmp_path, monkeypatch):
    """A writable run directory inside a read-only folder: the lock file beside it is what
    cannot be written, and the message says so (not 'a read-only run directory')."""
    run = tmp_path / "parent" / "run"
    run.mkdir(parents=True)
    real_open = os.open

    def read_only_parent(path, *args, **kwargs):
        if str(path).endswith(".run.lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(run_dir.os, "open", read_only_parent)
    with pytest.raises(RunDirectoryError, match=r"parent/\.run\.lock: cannot create the run's lock file \(Permission "
                                                r"denied\); it lives beside the run directory, in .*/parent, which "
                                                r"this process cannot write, although .*/run itself is writable"):
        run_lock.lock_run(run)


# ----------------------------------------------------------------------------- finished is final
def test_resuming_a_finished_run_says_so_and_changes_nothing(finished_run, tmp_path, capsys):
    run, config, _ = copy_run(finished_run, tmp_path)
    before = _files(run)
    assert main(["--output-dir", str(run), "--resume"]) == 0
    assert "finished at step 3 before this resume: nothing to do, nothing changed" in capsys.readouterr().out
    assert _files(run) == before
    assert main(["--output-dir", str(run), "--resume", "--total-steps", "2"]) == 1
    assert ("--total-steps 2 lies below the run's last step: it finished at step 3, and a resume cannot undo "
            "steps. Nothing was changed") in capsys.readouterr().err
    assert _files(run) == before


# ------------------------------------------------------------------- checkpoints that prove what they are
def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("target", ["policy/model.safetensors", "trainer_state.pt"])
def test_a_flipped_byte_is_named_and_the_previous_checkpoint_loads(finished_run, tmp_path, target):
    """One bit changed in tensor data (the last bytes of the weights; the middle of the
    optimizer state) still parses, and before digests resumed silently."""
    run, config, _ = copy_run(finished_run, tmp_path)
    path = run / "checkpoints" / "step_000003" / target
    _flip_byte(path, -3 if target.endswith("safetensors") else path.stat().st_size // 2)
    with pytest.warns(UserWarning, match=rf"step_000003: damaged checkpoint skipped \(ValueError: .*step_000003/"
                                         rf"{target}: its bytes differ from those written at the save"):
        trainer = resume(config.replace(total_steps=4), stop_after=2)
    assert trainer.step == 2


def test_nan_in_the_optimizer_state_is_named_and_the_previous_checkpoint_loads(finished_run, tmp_path):
    """Digests that agree (a checkpoint saved that way) do not let NaN moments through."""
    run, config, _ = copy_run(finished_run, tmp_path)
    folder = run / "checkpoints" / "step_000003"
    state = torch.load(folder / "trainer_state.pt", weights_only=True)
    first = next(iter(state["policy_optimizer"]["state"].values()))
    first["exp_avg"].view(-1)[0] = float("nan")
    torch.save(state, folder / "trainer_state.pt")
    checkpoints.write_digests(folder)
    with pytest.warns(UserWarning, match=r"step_000003: damaged checkpoint skipped \(ValueError: .*trainer_state.pt: "
                                         r"policy_optimizer state of parameter \d+ \(exp_avg\) holds non-finite"):
        trainer = resume(config.replace(total_steps=4), stop_after=2)
    assert trainer.step == 2


def test_a_checkpoint_of_another_run_is_refused(finished_run, tmp_path):
    """A checkpoint copied in from a run of another seed and KL coefficient (its own digests
    intact): refused naming the fields, nothing loaded or changed. Changes this run's earlier
    resumes were allowed to make (resume_history.jsonl) are not foreign."""
    run, config, _ = copy_run(finished_run, tmp_path)
    folder = run / "checkpoints" / "step_000003"
    state = json.loads((folder / "state.json").read_text())
    state["identity"] = checkpoints.run_identity(config.replace(seed=7, kl_coef=0.2))
    (folder / "state.json").write_text(json.dumps(state))
    checkpoints.write_digests(folder)
    before = _files(run)
    with pytest.raises(checkpoints.ForeignCheckpointError,
                       match=r"step_000003: written by another run \(seed 7, gae; this run: seed 0, gae\), not "
                             r"loaded: kl_coef: 0.2 there, 0.05 here; seed: 7 there, 0 here\. Loading it would "
                             r"continue that run here\. Move it out of checkpoints/"):
        resume(config.replace(total_steps=4))
    assert _files(run) == before
    with open(run / "resume_history.jsonl", "a") as handle:
        handle.write(json.dumps({"resumed_at_step": 2, "changed": {
            "seed": {"before": 7, "after": 0}, "kl_coef": {"before": 0.2, "after": 0.05}}}) + "\n")
    assert resume(config.replace(total_steps=4), stop_after=3).step == 3


def test_a_checkpoint_written_before_a_config_field_was_added_is_still_this_runs(finished_run, tmp_path):
    """A field added to (or removed from) PPOConfig since the save is no difference of runs."""
    run, config, _ = copy_run(finished_run, tmp_path)
    folder = run / "checkpoints" / "step_000003"
    state = json.loads((folder / "state.json").read_text())
    identity = checkpoints.run_identity(config)
    del identity["config"]["kl_coef"]
    identity["config"]["a_field_since_removed"] = 1
    state["identity"] = {**identity, "fingerprint": "written-earlier"}
    (folder / "state.json").write_text(json.dumps(state))
    checkpoints.write_digests(folder)
    assert resume(config.replace(total_steps=4), stop_after=3).step == 3


# ---------------------------------------------------------------------------- misleading messages
def test_a_model_path_spelled_another_way_is_the_same_model(finished_run, tmp_path, tiny_model_dir, monkeypatch):
    run, config, _ = copy_run(finished_run, tmp_path)
    assert run_dir.resume_changes(run, config.replace(model_path=f"{tiny_model_dir}/")) == {}
    monkeypatch.chdir(tiny_model_dir.parent)
    assert run_dir.resume_changes(run, config.replace(model_path=tiny_model_dir.name)) == {}
    with pytest.raises(RunDirectoryError) as error:
        run_dir.resume_changes(run, config.replace(model_path=str(tmp_path)))
    message = str(error.value)
    assert "model_path cannot change on resume" in message and "--allow-change model_path" not in message
    assert "Resume with the run's model_path" in message


def test_more_threads_than_the_machine_can_start_are_refused(capsys, tmp_path):
    with pytest.raises(ValueError, match=r"PPOConfig.threads: 100000 torch threads on \d+ CPU"):
        PPOConfig(threads=100000).validate_for_run()
    PPOConfig(threads=2).validate_for_run()
    assert main(["--threads", "100000", "--output-dir", str(tmp_path / "run")]) == 1
    assert "ppo-train: error: PPOConfig.threads: 100000" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
