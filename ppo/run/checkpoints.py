"""Checkpoints of a training run: written atomically, read back only when intact.

A checkpoint is a folder ``OUTPUT_DIR/checkpoints/step_NNNNNN`` holding

- ``policy/`` (weights and tokenizer, or the LoRA adapter, and a model card ``README.md``:
  `ppo.run.model_card`) and ``value/`` (the critic), both as safetensors;
- ``trainer_state.pt``: optimizer and scheduler state, the RNG streams of the main process;
- ``state.json``: step, KL controller, adaptive entropy coefficient, retired prompts, world
  size, samples generated;
- ``reference.safetensors`` when the reference moves (`ref_update_every`): its weights;
- ``rng_rank{r}.pt`` for every other process: its own prompt, sampling and shuffling streams;
- ``sharded/`` under `PPOConfig.sharding` "fsdp": every rank's shards of the trained weights
  and AdamW state (``torch.distributed.checkpoint``; ppo/parallel/sharding.py), which a resume with
  the same number of processes loads; ``policy/`` and ``value/`` are then gathered whole
  models for ``from_pretrained``, and ``trainer_state.pt`` holds no optimizer state.

Each checkpoint proves what it is: ``digests.json`` holds the SHA-256 of every other file in
the folder (written last, just before the rename), and ``state.json`` the identity of the run
that wrote it (its seed and its config, the fields a resume may change aside). `load` checks
both: a file whose bytes changed is named and the checkpoint skipped for the previous intact
one; a checkpoint of another run (copied in from another preset, seed or config) is refused,
naming the fields that differ, since loading it would continue that run here.

`save` writes into a temporary folder and renames it into place, so a run killed mid-write
leaves the previous checkpoint untouched; a write that fails (a full disk) removes the
temporary folder and stops the run naming the disk, the previous checkpoint intact. Every
file it writes goes into the run's manifest (``--restart`` removes exactly those). `load` takes the newest checkpoint whose every
file reads back and whose ``state.json`` holds values of the right type and range (its step
that of its folder); a damaged one is skipped with a warning (on every rank alike). The trainer
calls each once (`RLTrainer.save_checkpoint`, `RLTrainer.load_checkpoint`), handing over
what a checkpoint holds: the models and optimizers (`ppo.models.setup.Models`) and where the
run stands (`TrainingState`: step, RNG streams, KL controller, ...); the run directory's
other files (config, metrics, resume checks) are `ppo/run/run_dir.py`'s.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import random
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from value_model.model import load_value_weights

from ppo.parallel import distributed, sharding
from ppo.run import model_card, run_dir
from ppo.config import upgrade_field_names
from ppo.run.evaluation import accelerator_rng_devices
from ppo.models.lora import load_policy_weights, save_policy

if TYPE_CHECKING:
    from ppo.algorithm.filtering import PromptPool
    from ppo.algorithm.kl import FixedKLController
    from ppo.algorithm.policy_losses import EntropyControl
    from ppo.models.setup import Models
    from ppo.models.staleness import PolicyHistory

SHARDED = "sharded"  # the folder of a sharded run's training state (torch.distributed.checkpoint)
HISTORY = "policy_history.pt"  # rollout_staleness > 0: the kept weights sampling lags behind
DIGESTS = "digests.json"  # SHA-256 of every other file of a checkpoint, written last
# Config fields left out of a checkpoint's identity: those a resume may always change, and
# those that change where a run reports or how fast it goes, not what it computes.
IDENTITY_IGNORED = run_dir.RESUMABLE_FIELDS + ("compile_forward", "retain_freed_memory", "report_to",
                                                "tracker_project", "run_name", "run_group", "run_tags")


@dataclass
class TrainingState:
    """Where a run stands between steps: everything a checkpoint restores besides the models.

    ``rng`` draws the prompts (through ``prompt_pool``, which also holds the retired ones),
    ``shuffle_generator`` the minibatch order; ``kl_controller`` holds beta
    (`ppo.algorithm.kl`), ``entropy_control`` the adaptive entropy coefficient
    (`ppo.algorithm.policy_losses.EntropyControl`); ``step`` counts the RL steps taken and
    ``samples_generated`` the responses generated over all ranks (dynamic sampling makes
    extra). ``latest_eval`` (step, held-out metrics) of the latest evaluation goes into the
    model card, not into the checkpoint's state. ``policy_history`` keeps the weights of the
    last k steps that rollouts are sampled with under ``rollout_staleness = k``
    (`ppo.models.staleness`), saved as ``policy_history.pt`` so a resumed run samples from
    the same versions.
    """

    rng: random.Random
    shuffle_generator: torch.Generator
    prompt_pool: PromptPool
    kl_controller: FixedKLController  # or an adaptive one (same interface)
    entropy_control: EntropyControl
    step: int = 0
    samples_generated: int = 0
    latest_eval: tuple[int, dict] | None = None
    policy_history: PolicyHistory | None = None  # rollout_staleness > 0: the weights sampling lags behind


def save(models: Models, state: TrainingState, config, output_dir: Path) -> Path:
    """Write ``output_dir/checkpoints/step_N`` atomically (temp dir + rename); prune old ones.

    `models` is the run's `ppo.models.setup.Models` (weights, tokenizer, optimizers), `state`
    where it stands (N is ``state.step``), `config` its `PPOConfig`.

    The main process writes the weights and optimizer state (identical on every rank);
    every other rank adds its own RNG state (``rng_rank{r}.pt``: its prompts, samples and
    minibatch order), so an N-process resume continues exactly like a straight run. A failed
    write stops every rank with `CheckpointWriteError`; the temporary folder is removed.
    """
    root = output_dir / "checkpoints"
    final = root / f"step_{state.step:06d}"
    tmp = root / f".tmp_step_{state.step:06d}_{distributed.broadcast_object(os.getpid())}"
    main = distributed.is_main_process()

    def stop_if_failed(error: Exception | None) -> None:
        _stop_if_failed(error, tmp, final, state.step, output_dir)

    # Sharded models (sharding="fsdp"): every rank sends its shards for the whole models the
    # main process writes, then writes its own shards of the training state.
    whole = _consolidated(models) if sharding.sharded(config) else {}
    error = _attempt(lambda: _write_main(models, state, config, tmp, whole)) if main else None
    stop_if_failed(error)  # every rank decides together: the folder exists
    if sharding.sharded(config):
        reference = models.ref_policy if _moving_reference(models, config) else None
        error = _attempt(lambda: sharding.save_sharded(tmp / SHARDED, models.policy, models.value_model,
                                                       models.optimizers.all(), reference))
        stop_if_failed(error)
    if not main:
        error = _attempt(lambda: torch.save(rng_state(state), tmp / f"rng_rank{distributed.rank()}.pt"))
    stop_if_failed(error)  # every rank's state is in it
    if main:
        error = _attempt(lambda: _publish(tmp, final, output_dir, config.keep_checkpoints))
    stop_if_failed(error)
    return final


class CheckpointWriteError(run_dir.RunDirectoryError):
    """A checkpoint could not be written (a full disk, a read-only one); the previous one is intact."""


def _attempt(write) -> Exception | None:
    try:
        write()
    except (OSError, RuntimeError) as exc:  # torch reports a full disk as RuntimeError (inline_container.cc)
        return exc
    return None


def _consolidated(models: Models) -> dict:
    """The whole policy's and critic's state dicts gathered from their shards (on the main
    process; every rank takes part)."""
    whole = {"policy": sharding.consolidated_state_dict(models.policy)}
    if models.value_model is not None:
        whole["value"] = sharding.consolidated_state_dict(models.value_model)
    return whole


def _write_main(models: Models, state: TrainingState, config, tmp: Path, whole: dict) -> None:
    """The main process's files; `whole` holds the gathered state dicts of sharded models."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_policy(models.policy_module, tmp / "policy", whole.get("policy"))
    models.tokenizer.save_pretrained(tmp / "policy")
    # README.md: what this policy is, for whoever finds it later
    model_card.write(tmp / "policy", config, state.step, models.model_path, state.latest_eval)
    if models.value_model is not None:
        models.value_module.save_pretrained(tmp / "value", whole.get("value"))
    sharded = sharding.sharded(config)
    if _moving_reference(models, config) and not sharded:  # a refreshed reference is training state too
        from safetensors.torch import save_model

        save_model(_reference_module(models), str(tmp / "reference.safetensors"))
    optimizers = models.optimizers
    optimizer_states = {} if sharded else {  # sharded: in sharded/ with the weights' shards
        "policy_optimizer": optimizers.policy.state_dict(),
        "value_optimizer": optimizers.value.state_dict() if optimizers.value else None}
    torch.save({
        **optimizer_states,
        "schedulers": [s.state_dict() for s in optimizers.schedulers],
        **rng_state(state),
    }, tmp / "trainer_state.pt")
    if state.policy_history is not None:
        torch.save(state.policy_history.state_dict(), tmp / HISTORY)
    (tmp / "state.json").write_text(json.dumps({
        "step": state.step, "kl_controller": state.kl_controller.state_dict(),
        "model_path": models.model_path, "retired_prompts": sorted(state.prompt_pool.retired),
        "world_size": distributed.world_size(), "sharding": "fsdp" if sharded else "none",
        "samples_generated": state.samples_generated,
        "entropy_coef": state.entropy_control.coef, "entropy_last": state.entropy_control.last_entropy,
        "identity": run_identity(config), "digests": DIGESTS}))


def run_identity(config) -> dict:
    """Which run a checkpoint belongs to: its seed, estimator and every config field a resume
    cannot change without saying so (`IDENTITY_IGNORED` aside), with their fingerprint."""
    fields = {name: value for name, value in config.to_dict().items() if name not in IDENTITY_IGNORED}
    text = json.dumps(fields, sort_keys=True, default=str)
    return {"fingerprint": hashlib.sha256(text.encode()).hexdigest()[:16], "seed": config.seed,
            "advantage_estimator": config.advantage_estimator, "config": json.loads(text)}


def write_digests(folder: Path) -> None:
    """Record the SHA-256 of every file under `folder` in its ``digests.json``."""
    files = sorted(f for f in folder.rglob("*") if f.is_file() and f.name != DIGESTS)
    digests = {str(f.relative_to(folder)): file_digest(f) for f in files}
    (folder / DIGESTS).write_text(json.dumps(digests, indent=1))


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_digests(folder: Path, info: dict) -> None:
    """Raise naming the first file of `folder` whose bytes differ from those saved (or that is
    missing). Checkpoints written before digests existed (no ``digests`` in ``state.json``)
    are not checked."""
    if "digests" not in info:
        return
    try:
        recorded = json.loads((folder / DIGESTS).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{folder / DIGESTS}: missing or unreadable ({error}), so the files cannot be verified")
    if not isinstance(recorded, dict) or "state.json" not in recorded:
        raise ValueError(f"{folder / DIGESTS}: not the digest list this project writes")
    for name, expected in sorted(recorded.items()):
        path = folder / name
        if not path.is_file():
            raise ValueError(f"{path}: missing (listed in {DIGESTS})")
        if file_digest(path) != expected:
            raise ValueError(f"{path}: its bytes differ from those written at the save (SHA-256 mismatch): the file "
                             "was damaged or changed since")


class ForeignCheckpointError(run_dir.RunDirectoryError):
    """A checkpoint written by another run (another seed, preset or config)."""


def check_identity(config, output_dir: Path, path: Path, info: dict, allowed: set) -> None:
    """Refuse a checkpoint whose run differs from this one (`config`, in `output_dir`) in a
    field neither this resume (`allowed`) nor an earlier one (``resume_history.jsonl``)
    allowed to change."""
    identity = info.get("identity")
    if not isinstance(identity, dict) or not isinstance(identity.get("config"), dict):
        return  # written before checkpoints carried their run's identity
    ours = run_identity(config)
    if identity.get("fingerprint") == ours["fingerprint"]:
        return
    allowed = allowed | _changed_before(output_dir)
    try:
        theirs = upgrade_field_names(identity["config"])  # fields renamed since it was written
    except ValueError:
        theirs = identity["config"]
    same = {"model_path": run_dir.same_model_path(theirs.get("model_path"), ours["config"].get("model_path"))}
    # Fields on one side only were added or removed since it was written: not a difference of runs.
    differing = sorted(name for name in set(theirs) & set(ours["config"])
                       if theirs[name] != ours["config"][name] and name not in allowed and not same.get(name))
    if not differing:
        return
    listed = "; ".join(f"{name}: {theirs.get(name)!r} there, {ours['config'].get(name)!r} here"
                       for name in differing[:6]) + (f"; and {len(differing) - 6} more" if len(differing) > 6 else "")
    raise ForeignCheckpointError(
        f"{path}: written by another run (seed {identity.get('seed')}, {identity.get('advantage_estimator')}; this "
        f"run: seed {config.seed}, {config.advantage_estimator}), not loaded: {listed}. Loading it "
        "would continue that run here. Move it out of checkpoints/ (the run then resumes from its own older "
        "checkpoints), or resume that run in its own output_dir")


def _changed_before(output_dir: Path) -> set:
    """Fields that earlier resumes of the run were allowed to change (``resume_history.jsonl``)."""
    changed = set()
    try:
        lines = (Path(output_dir) / "resume_history.jsonl").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return changed
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("changed"), dict):
            changed |= set(entry["changed"])
    return changed


def _moving_reference(models: Models, config) -> bool:
    """Whether the reference moves (`ref_update_every`), so its weights are training state."""
    return bool(config.ref_update_every) and models.ref_policy is not None and not config.lora_r


def _reference_module(models: Models):
    return getattr(models.ref_policy, "module", models.ref_policy)


def _publish(tmp: Path, final: Path, output_dir: Path, keep: int) -> None:
    """Rename the finished folder into place, list its files in the manifest, prune old ones
    (never a folder this run did not write: a link is refused before training starts)."""
    root = final.parent
    write_digests(tmp)  # last: every rank's files are in
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    run_dir.record_written(output_dir, *(f for f in sorted(final.rglob("*")) if f.is_file()))
    existing = sorted(p for p in root.glob("step_*") if p.is_dir() and not p.is_symlink())
    for old in existing[:-keep] if keep else []:
        shutil.rmtree(old)


def _stop_if_failed(error: Exception | None, tmp: Path, final: Path, step: int, output_dir: Path) -> None:
    """Stop every rank when one failed to write; remove the partial folder (main process)."""
    if not distributed.any_rank(error is not None):
        return
    if distributed.is_main_process():
        shutil.rmtree(tmp, ignore_errors=True)
    previous = [p.name for p in run_dir.checkpoint_candidates(output_dir) if p != final]
    kept = (f"the previous checkpoint {previous[0]} is intact, and --resume continues from it"
            if previous else "no earlier checkpoint exists; --resume starts the run again from step 0")
    reason = f"{type(error).__name__}: {error}" if error is not None else "failed on another process"
    raise CheckpointWriteError(f"{final}: could not write the checkpoint of step {step} ({reason}); "
                               f"{disk_report(output_dir, error)}; {kept}") from None


def disk_report(path: Path, error: Exception | None) -> str:
    """Which disk holds `path` (its mount point) and how much room is left on it."""
    mount = Path(os.path.abspath(path))
    while not mount.exists() or not os.path.ismount(mount):
        mount = mount.parent
    try:
        free = f"{shutil.disk_usage(mount).free / 2**20:.0f} MiB free"
    except OSError:
        free = "free space unknown"
    full = isinstance(error, OSError) and error.errno == errno.ENOSPC or "enforce fail" in str(error)
    what = "the disk is full" if full else "the write failed"
    return f"{what}: the disk mounted at {mount} holds the run ({free}); make room or move the run"


def load(models: Models, state: TrainingState, config, output_dir: Path, allow_changes=()) -> bool:
    """Restore the newest intact checkpoint of the run in `output_dir` into `models` (a
    `ppo.models.setup.Models`: weights and optimizers) and `state`; False when there is none.

    A checkpoint that cannot be read (truncated weights, a damaged ``trainer_state.pt``,
    or a crafted one: ``torch.load(weights_only=True)`` refuses pickles that would run
    code) is skipped with a warning for the next older one; every rank skips the same
    ones. A checkpoint loads under any number of processes that divides the batch; ranks
    that have no saved RNG state (the world size changed) start fresh streams from their
    seed and the step, so the run continues correctly but not bit-identically. A file whose
    digest differs from the one saved is damage (skipped); a checkpoint of another run
    (`check_identity`; `allow_changes` names the fields this resume may change) is refused.
    """
    skipped = []
    allowed = {run_dir.renamed(name) if name in run_dir.RENAMED_FIELDS else name for name in allow_changes}
    for path in run_dir.checkpoint_candidates(output_dir):
        try:
            saved, error = _read(models, config, output_dir, path, allowed), None
        except run_dir.RunDirectoryError:
            raise
        except Exception as exc:  # any way a file fails to read means a damaged checkpoint
            saved, error = None, exc
        if distributed.any_rank(error is not None):
            reason = f"{type(error).__name__}: {error}" if error is not None else "damaged on another process"
            warnings.warn(f"{path}: damaged checkpoint skipped ({reason})")
            skipped.append(f"{path.name} ({reason})")
            continue
        _apply(models, state, config, path, saved)
        return True
    if skipped:
        raise run_dir.RunDirectoryError(f"{output_dir / 'checkpoints'}: no intact checkpoint ("
                                        + "; ".join(skipped) + "); pass --restart to start the run over")
    return False


def rng_state(state: TrainingState) -> dict:
    """Every random stream this process draws from: torch (CPU and accelerator), the
    minibatch shuffler and the prompt sampler."""
    streams = {"torch_rng": torch.get_rng_state(), "shuffle_rng": state.shuffle_generator.get_state(),
               "python_rng": state.rng.getstate()}
    accelerator = accelerator_rng_devices()
    if accelerator is not None:  # the GPU sampling stream, so a resume on GPU is exact too
        streams["device_rng"] = torch.get_device_module(accelerator[0]).get_rng_state_all()
    return streams


def set_rng_state(state: TrainingState, streams: dict) -> None:
    """Set every random stream `rng_state` saved: torch's, and `state`'s shuffler and prompt sampler."""
    accelerator = accelerator_rng_devices()
    if accelerator is not None and streams.get("device_rng") is not None:
        torch.get_device_module(accelerator[0]).set_rng_state_all(streams["device_rng"])
    torch.set_rng_state(streams["torch_rng"])
    state.shuffle_generator.set_state(streams["shuffle_rng"])
    state.rng.setstate(streams["python_rng"])


def check_state(info, path: Path) -> None:
    """Refuse a ``state.json`` whose values have the wrong type or range (hand-edited, or
    damaged yet still JSON): its step must be the folder's, the KL coefficient finite."""
    def refuse(field, why):
        raise ValueError(f"{path / 'state.json'}: {field} {why}")

    if not isinstance(info, dict):
        refuse("content", f"is {type(info).__name__}, not a JSON object")
    step = info.get("step")
    folder_step = int(path.name.split("_")[-1])
    if type(step) is not int or step != folder_step or step < 0:
        refuse("step", f"is {step!r}, not the step {folder_step} of the folder it is in")
    kl = info.get("kl_controller")
    value = kl.get("value") if isinstance(kl, dict) else None
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        refuse("kl_controller", f"is {kl!r}, not {{'value': a finite coefficient >= 0}}")
    world = info.get("world_size", 1)
    if type(world) is not int or world < 1:
        refuse("world_size", f"is {world!r}, not a positive integer")
    samples = info.get("samples_generated", 0)
    if type(samples) is not int or samples < 0:
        refuse("samples_generated", f"is {samples!r}, not a count")
    coef = info.get("entropy_coef", 0.0)
    if type(coef) not in (int, float) or not math.isfinite(coef) or coef < 0:
        refuse("entropy_coef", f"is {coef!r}, not a finite coefficient >= 0")
    last = info.get("entropy_last")
    if last is not None and (type(last) not in (int, float) or not math.isfinite(last)):
        refuse("entropy_last", f"is {last!r}, not a finite entropy or null")
    retired = info.get("retired_prompts", [])
    if not isinstance(retired, list) or not all(isinstance(r, (str, int)) for r in retired):
        refuse("retired_prompts", f"is {_brief(retired)}, not a list of prompts")


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def _read(models: Models, config, output_dir: Path, path: Path, allowed: set = frozenset()) -> dict:
    """Every file of one checkpoint, verified and read into memory (raises if any is damaged;
    `ForeignCheckpointError` for another run's)."""
    info = json.loads((path / "state.json").read_text())
    check_state(info, path)  # first: a value out of range is named more exactly than a changed digest
    verify_digests(path, info)
    check_identity(config, output_dir, path, info, allowed)  # not damage: refused, never skipped
    sharding.check_resume_layout(info, config, path)  # not damage: refused, never skipped
    state = torch.load(path / "trainer_state.pt", weights_only=True)
    check_finite_state(state, path / "trainer_state.pt")
    saved = {"info": info, "step": int(info["step"]), "kl_controller": info["kl_controller"], "trainer": state}
    check_safetensors(path / "policy")
    if models.value_model is not None:
        check_safetensors(path / "value")
    if sharding.sharded(config) and not (path / SHARDED / ".metadata").is_file():
        raise FileNotFoundError(f"{path / SHARDED}: no sharded training state")
    if _moving_reference(models, config) and not sharding.sharded(config):
        from safetensors.torch import load_file

        load_file(str(path / "reference.safetensors"))  # raises when missing or damaged
    if config.rollout_staleness and (path / HISTORY).exists():  # (its digest is checked above)
        saved["policy_history"] = torch.load(path / HISTORY, weights_only=True)
    rank_file = path / f"rng_rank{distributed.rank()}.pt"
    same_world = info.get("world_size", 1) == distributed.world_size()
    if not distributed.is_main_process() and rank_file.exists() and same_world:
        saved["rank_rng"] = torch.load(rank_file, weights_only=True)
    return saved


def _apply(models: Models, state: TrainingState, config, path: Path, saved: dict) -> None:
    # The learning rate, eps and weight decay of this config: an optimizer's state dict
    # carries the saved ones, and a resume allowed to change them must use the new ones.
    settings = [[{k: g[k] for k in ("initial_lr", "eps", "weight_decay")} for g in s.optimizer.param_groups]
                for s in models.optimizers.schedulers]
    trainer_state = saved["trainer"]
    if sharding.sharded(config):
        reference = models.ref_policy if _moving_reference(models, config) else None
        sharding.load_sharded(path / SHARDED, models.policy, models.value_model, models.optimizers.all(), reference)
    else:
        _load_whole(models, config, path, trainer_state)
    _apply_rest(models, state, config, saved, trainer_state, settings)


def _load_whole(models: Models, config, path: Path, trainer_state: dict) -> None:
    """Weights and optimizer state of unsharded models (one process, or DDP)."""
    optimizers = models.optimizers
    try:
        load_policy_weights(models.policy_module, path / "policy")
        if models.value_model is not None:
            load_value_weights(models.value_module, path / "value")
        if _moving_reference(models, config):
            from safetensors.torch import load_model

            load_model(_reference_module(models), str(path / "reference.safetensors"))
        optimizers.policy.load_state_dict(trainer_state["policy_optimizer"])
        if optimizers.value is not None:
            optimizers.value.load_state_dict(trainer_state["value_optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError) as error:
        raise run_dir.RunDirectoryError(f"{path}: does not fit the model and optimizer this config builds "
                                        f"({type(error).__name__}: {error})") from None


def _apply_rest(models: Models, state: TrainingState, config, saved: dict, trainer_state: dict,
                settings: list) -> None:
    """Schedulers, RNG streams and the loop's own state."""
    for scheduler, scheduler_state, groups in zip(models.optimizers.schedulers, trainer_state["schedulers"], settings):
        scheduler.load_state_dict(scheduler_state)
        scheduler.base_lrs = [g["initial_lr"] for g in groups]
        for group, setting in zip(scheduler.optimizer.param_groups, groups):
            group.update(setting, lr=setting["initial_lr"] * scheduler.lr_lambdas[0](scheduler.last_epoch))
    info = saved["info"]
    if distributed.is_main_process():
        set_rng_state(state, trainer_state)
    elif "rank_rng" in saved:
        set_rng_state(state, saved["rank_rng"])
    else:
        seed = distributed.rank_seed(config.seed + info["step"], distributed.rank())
        set_rng_state(state, {"torch_rng": torch.manual_seed(seed).get_state(),
                              "shuffle_rng": torch.Generator().manual_seed(seed).get_state(),
                              "python_rng": random.Random(seed).getstate()})
    state.step = saved["step"]
    state.kl_controller.load_state_dict(saved["kl_controller"])
    state.entropy_control.coef = info.get("entropy_coef", state.entropy_control.coef)
    state.entropy_control.last_entropy = info.get("entropy_last", state.entropy_control.last_entropy)
    state.prompt_pool.retired = set(info.get("retired_prompts", []))
    state.samples_generated = info.get("samples_generated", state.step * config.rollout_batch_size)
    history = saved.get("policy_history")
    if state.policy_history is not None and history is not None and history.get("staleness") == config.rollout_staleness:
        state.policy_history.load_state_dict(history)
    # else (a resume allowed to change rollout_staleness): the lag starts again from the resumed weights


def check_safetensors(path: Path) -> None:
    """Read every weight file under `path` (raises on a truncated or garbled one)."""
    from safetensors.torch import load_file

    files = sorted(path.rglob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no safetensors weights")
    for file in files:
        for name, tensor in load_file(str(file)).items():
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise ValueError(f"{file}: weight {name} holds non-finite values")


def check_finite_state(state, file: Path) -> None:
    """Raise naming `file` and the entry when the optimizer state holds NaN or infinity (it
    would turn the first update's weights non-finite)."""
    for key in ("policy_optimizer", "value_optimizer"):
        optimizer = state.get(key) if isinstance(state, dict) else None
        if not isinstance(optimizer, dict):
            continue
        for index, entry in (optimizer.get("state") or {}).items():
            for name, value in entry.items():
                if torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all():
                    raise ValueError(f"{file}: {key} state of parameter {index} ({name}) holds non-finite values")
