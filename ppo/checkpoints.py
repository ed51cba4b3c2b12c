"""Checkpoints of a training run: written atomically, read back only when intact.

A checkpoint is a folder ``OUTPUT_DIR/checkpoints/step_NNNNNN`` holding

- ``policy/`` (weights and tokenizer, or the LoRA adapter, and a model card ``README.md``:
  `ppo.model_card`) and ``value/`` (the critic), both as safetensors;
- ``trainer_state.pt``: optimizer and scheduler state, the RNG streams of the main process;
- ``state.json``: step, KL controller, adaptive entropy coefficient, retired prompts, world
  size, samples generated;
- ``reference.safetensors`` when the reference moves (`ref_update_every`): its weights;
- ``rng_rank{r}.pt`` for every other process: its own prompt, sampling and shuffling streams;
- ``sharded/`` under `PPOConfig.sharding` "fsdp": every rank's shards of the trained weights
  and AdamW state (``torch.distributed.checkpoint``; ppo/sharding.py), which a resume with
  the same number of processes loads; ``policy/`` and ``value/`` are then gathered whole
  models for ``from_pretrained``, and ``trainer_state.pt`` holds no optimizer state.

`save` writes into a temporary folder and renames it into place, so a run killed mid-write
leaves the previous checkpoint untouched; a write that fails (a full disk) removes the
temporary folder and stops the run naming the disk, the previous checkpoint intact. Every
file it writes goes into the run's manifest (``--restart`` removes exactly those). `load` takes the newest checkpoint whose every
file reads back and whose ``state.json`` holds values of the right type and range (its step
that of its folder); a damaged one is skipped with a warning (on every rank alike). The trainer
calls each once (`RLTrainer.save_checkpoint`, `RLTrainer.load_checkpoint`); the run
directory's other files (config, metrics, resume checks) are `ppo/run_dir.py`'s.
"""

from __future__ import annotations

import errno
import json
import math
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from value_model.model import load_value_weights

from . import distributed, model_card, run_dir, sharding
from .evaluation import accelerator_rng_devices
from .lora import load_policy_weights, save_policy

if TYPE_CHECKING:
    from .trainer import RLTrainer

SHARDED = "sharded"  # the folder of a sharded run's training state (torch.distributed.checkpoint)


def save(trainer: RLTrainer) -> Path:
    """Write ``checkpoints/step_N`` atomically (temp dir + rename); prune old ones.

    The main process writes the weights and optimizer state (identical on every rank);
    every other rank adds its own RNG state (``rng_rank{r}.pt``: its prompts, samples and
    minibatch order), so an N-process resume continues exactly like a straight run. A failed
    write stops every rank with `CheckpointWriteError`; the temporary folder is removed.
    """
    root = trainer.output_dir / "checkpoints"
    final = root / f"step_{trainer.step:06d}"
    tmp = root / f".tmp_step_{trainer.step:06d}_{distributed.broadcast_object(os.getpid())}"
    main = distributed.is_main_process()
    # Sharded models (sharding="fsdp"): every rank sends its shards for the whole models the
    # main process writes, then writes its own shards of the training state.
    whole = _consolidated(trainer) if sharding.sharded(trainer.config) else {}
    error = _attempt(lambda: _write_main(trainer, tmp, whole)) if main else None
    _stop_if_failed(trainer, error, tmp, final)  # every rank decides together: the folder exists
    if sharding.sharded(trainer.config):
        error = _attempt(lambda: sharding.save_sharded(trainer, tmp / SHARDED))
        _stop_if_failed(trainer, error, tmp, final)
    if not main:
        error = _attempt(lambda: torch.save(rng_state(trainer), tmp / f"rng_rank{distributed.rank()}.pt"))
    _stop_if_failed(trainer, error, tmp, final)  # every rank's state is in it
    if main:
        error = _attempt(lambda: _publish(trainer, tmp, final))
    _stop_if_failed(trainer, error, tmp, final)
    return final


class CheckpointWriteError(run_dir.RunDirectoryError):
    """A checkpoint could not be written (a full disk, a read-only one); the previous one is intact."""


def _attempt(write) -> Exception | None:
    try:
        write()
    except (OSError, RuntimeError) as exc:  # torch reports a full disk as RuntimeError (inline_container.cc)
        return exc
    return None


def _consolidated(trainer: RLTrainer) -> dict:
    """The whole policy's and critic's state dicts gathered from their shards (on the main
    process; every rank takes part)."""
    whole = {"policy": sharding.consolidated_state_dict(trainer.policy)}
    if trainer.value_model is not None:
        whole["value"] = sharding.consolidated_state_dict(trainer.value_model)
    return whole


def _write_main(trainer: RLTrainer, tmp: Path, whole: dict) -> None:
    """The main process's files; `whole` holds the gathered state dicts of sharded models."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_policy(trainer.accelerator.unwrap_model(trainer.policy), tmp / "policy", whole.get("policy"))
    trainer.tokenizer.save_pretrained(tmp / "policy")
    model_card.write(tmp / "policy", trainer)  # README.md: what this policy is, for whoever finds it later
    if trainer.value_model is not None:
        trainer.accelerator.unwrap_model(trainer.value_model).save_pretrained(tmp / "value", whole.get("value"))
    sharded = sharding.sharded(trainer.config)
    if _moving_reference(trainer) and not sharded:  # a refreshed reference is training state too
        from safetensors.torch import save_model

        save_model(_reference_module(trainer), str(tmp / "reference.safetensors"))
    optimizers = {} if sharded else {  # sharded: in sharded/ with the weights' shards
        "policy_optimizer": trainer.policy_optimizer.state_dict(),
        "value_optimizer": trainer.value_optimizer.state_dict() if trainer.value_optimizer else None}
    torch.save({
        **optimizers,
        "schedulers": [s.state_dict() for s in trainer.schedulers],
        **rng_state(trainer),
    }, tmp / "trainer_state.pt")
    (tmp / "state.json").write_text(json.dumps({
        "step": trainer.step, "kl_controller": trainer.kl_controller.state_dict(),
        "model_path": trainer.model_path, "retired_prompts": sorted(trainer.prompt_pool.retired),
        "world_size": distributed.world_size(), "sharding": "fsdp" if sharded else "none",
        "samples_generated": trainer.samples_generated,
        "entropy_coef": trainer.entropy_control.coef, "entropy_last": trainer.entropy_control.last_entropy}))


def _moving_reference(trainer: RLTrainer) -> bool:
    return bool(trainer.config.ref_update_every) and trainer.ref_policy is not None and not trainer.config.lora_r


def _reference_module(trainer: RLTrainer):
    return getattr(trainer.ref_policy, "module", trainer.ref_policy)


def _publish(trainer: RLTrainer, tmp: Path, final: Path) -> None:
    """Rename the finished folder into place, list its files in the manifest, prune old ones
    (never a folder this run did not write: a link is refused before training starts)."""
    root = final.parent
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    run_dir.record_written(trainer.output_dir, *(f for f in sorted(final.rglob("*")) if f.is_file()))
    existing = sorted(p for p in root.glob("step_*") if p.is_dir() and not p.is_symlink())
    keep = trainer.config.keep_checkpoints
    for old in existing[:-keep] if keep else []:
        shutil.rmtree(old)


def _stop_if_failed(trainer: RLTrainer, error: Exception | None, tmp: Path, final: Path) -> None:
    """Stop every rank when one failed to write; remove the partial folder (main process)."""
    if not distributed.any_rank(error is not None):
        return
    if distributed.is_main_process():
        shutil.rmtree(tmp, ignore_errors=True)
    previous = [p.name for p in run_dir.checkpoint_candidates(trainer.output_dir) if p != final]
    kept = (f"the previous checkpoint {previous[0]} is intact, and --resume continues from it"
            if previous else "no earlier checkpoint exists; --resume starts the run again from step 0")
    reason = f"{type(error).__name__}: {error}" if error is not None else "failed on another process"
    raise CheckpointWriteError(f"{final}: could not write the checkpoint of step {trainer.step} ({reason}); "
                               f"{disk_report(trainer.output_dir, error)}; {kept}") from None


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


def load(trainer: RLTrainer) -> bool:
    """Restore the newest intact checkpoint into `trainer`; False when there is none.

    A checkpoint that cannot be read (truncated weights, a damaged ``trainer_state.pt``,
    or a crafted one: ``torch.load(weights_only=True)`` refuses pickles that would run
    code) is skipped with a warning for the next older one; every rank skips the same
    ones. A checkpoint loads under any number of processes that divides the batch; ranks
    that have no saved RNG state (the world size changed) start fresh streams from their
    seed and the step, so the run continues correctly but not bit-identically.
    """
    skipped = []
    for path in run_dir.checkpoint_candidates(trainer.output_dir):
        try:
            saved, error = _read(trainer, path), None
        except run_dir.RunDirectoryError:
            raise
        except Exception as exc:  # any way a file fails to read means a damaged checkpoint
            saved, error = None, exc
        if distributed.any_rank(error is not None):
            reason = f"{type(error).__name__}: {error}" if error is not None else "damaged on another process"
            warnings.warn(f"{path}: damaged checkpoint skipped ({reason})")
            skipped.append(f"{path.name} ({reason})")
            continue
        _apply(trainer, path, saved)
        return True
    if skipped:
        raise run_dir.RunDirectoryError(f"{trainer.output_dir / 'checkpoints'}: no intact checkpoint ("
                                        + "; ".join(skipped) + "); pass --restart to start the run over")
    return False


def rng_state(trainer: RLTrainer) -> dict:
    """Every random stream this process draws from: torch (CPU and accelerator), the
    minibatch shuffler and the prompt sampler."""
    state = {"torch_rng": torch.get_rng_state(), "shuffle_rng": trainer.shuffle_generator.get_state(),
             "python_rng": trainer.rng.getstate()}
    accelerator = accelerator_rng_devices()
    if accelerator is not None:  # the GPU sampling stream, so a resume on GPU is exact too
        state["device_rng"] = torch.get_device_module(accelerator[0]).get_rng_state_all()
    return state


def set_rng_state(trainer: RLTrainer, state: dict) -> None:
    accelerator = accelerator_rng_devices()
    if accelerator is not None and state.get("device_rng") is not None:
        torch.get_device_module(accelerator[0]).set_rng_state_all(state["device_rng"])
    torch.set_rng_state(state["torch_rng"])
    trainer.shuffle_generator.set_state(state["shuffle_rng"])
    trainer.rng.setstate(state["python_rng"])


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


def _read(trainer: RLTrainer, path: Path) -> dict:
    """Every file of one checkpoint, read into memory (raises if any is damaged)."""
    info = json.loads((path / "state.json").read_text())
    check_state(info, path)
    sharding.check_resume_layout(info, trainer.config, path)  # not damage: refused, never skipped
    saved = {"info": info, "step": int(info["step"]), "kl_controller": info["kl_controller"],
             "trainer": torch.load(path / "trainer_state.pt", weights_only=True)}
    check_safetensors(path / "policy")
    if trainer.value_model is not None:
        check_safetensors(path / "value")
    if sharding.sharded(trainer.config) and not (path / SHARDED / ".metadata").is_file():
        raise FileNotFoundError(f"{path / SHARDED}: no sharded training state")
    if _moving_reference(trainer) and not sharding.sharded(trainer.config):
        from safetensors.torch import load_file

        load_file(str(path / "reference.safetensors"))  # raises when missing or damaged
    rank_file = path / f"rng_rank{distributed.rank()}.pt"
    same_world = info.get("world_size", 1) == distributed.world_size()
    if not distributed.is_main_process() and rank_file.exists() and same_world:
        saved["rank_rng"] = torch.load(rank_file, weights_only=True)
    return saved


def _apply(trainer: RLTrainer, path: Path, saved: dict) -> None:
    # The learning rate, eps and weight decay of this config: an optimizer's state dict
    # carries the saved ones, and a resume allowed to change them must use the new ones.
    settings = [[{k: g[k] for k in ("initial_lr", "eps", "weight_decay")} for g in s.optimizer.param_groups]
                for s in trainer.schedulers]
    state = saved["trainer"]
    if sharding.sharded(trainer.config):
        sharding.load_sharded(trainer, path / SHARDED)
    else:
        _load_whole(trainer, path, state)
    _apply_rest(trainer, saved, state, settings)


def _load_whole(trainer: RLTrainer, path: Path, state: dict) -> None:
    """Weights and optimizer state of unsharded models (one process, or DDP)."""
    try:
        load_policy_weights(trainer.accelerator.unwrap_model(trainer.policy), path / "policy")
        if trainer.value_model is not None:
            load_value_weights(trainer.accelerator.unwrap_model(trainer.value_model), path / "value")
        if _moving_reference(trainer):
            from safetensors.torch import load_model

            load_model(_reference_module(trainer), str(path / "reference.safetensors"))
        trainer.policy_optimizer.load_state_dict(state["policy_optimizer"])
        if trainer.value_optimizer is not None:
            trainer.value_optimizer.load_state_dict(state["value_optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError) as error:
        raise run_dir.RunDirectoryError(f"{path}: does not fit the model and optimizer this config builds "
                                        f"({type(error).__name__}: {error})") from None


def _apply_rest(trainer: RLTrainer, saved: dict, state: dict, settings: list) -> None:
    """Schedulers, RNG streams and the loop's own state."""
    for scheduler, scheduler_state, groups in zip(trainer.schedulers, state["schedulers"], settings):
        scheduler.load_state_dict(scheduler_state)
        scheduler.base_lrs = [g["initial_lr"] for g in groups]
        for group, setting in zip(scheduler.optimizer.param_groups, groups):
            group.update(setting, lr=setting["initial_lr"] * scheduler.lr_lambdas[0](scheduler.last_epoch))
    info = saved["info"]
    if distributed.is_main_process():
        set_rng_state(trainer, state)
    elif "rank_rng" in saved:
        set_rng_state(trainer, saved["rank_rng"])
    else:
        seed = distributed.rank_seed(trainer.config.seed + info["step"], distributed.rank())
        set_rng_state(trainer, {"torch_rng": torch.manual_seed(seed).get_state(),
                                "shuffle_rng": torch.Generator().manual_seed(seed).get_state(),
                                "python_rng": random.Random(seed).getstate()})
    trainer.step = saved["step"]
    trainer.kl_controller.load_state_dict(saved["kl_controller"])
    trainer.entropy_control.coef = info.get("entropy_coef", trainer.entropy_control.coef)
    trainer.entropy_control.last_entropy = info.get("entropy_last", trainer.entropy_control.last_entropy)
    trainer.prompt_pool.retired = set(info.get("retired_prompts", []))
    trainer.samples_generated = info.get("samples_generated", trainer.step * trainer.config.rollout_batch_size)


def check_safetensors(path: Path) -> None:
    """Read every weight file under `path` (raises on a truncated or garbled one)."""
    from safetensors.torch import load_file

    files = sorted(path.rglob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no safetensors weights")
    for file in files:
        load_file(str(file))
