"""Sharded models (PyTorch FSDP2): each process holds 1/N of every model's weights, gradients
and optimizer state, so four models too large for one device fit on N of them.

Implementation details that live here:

- **FSDP2 ``fully_shard``, set up here** (`PPOConfig.sharding` = "fsdp", `shard_models`):
  every transformer block (the classes a Hugging Face model lists in ``_no_split_modules``)
  is one FSDP unit, the model itself the root unit that holds embeddings, final norm and
  heads. A block's weights are all-gathered just before its forward and backward and freed
  after (ZeRO-3); gradients are reduce-scattered, each rank keeping the gradient of its own
  shard, and AdamW then updates that shard only (Zhao et al. 2023, "PyTorch FSDP";
  AlpacaFarm trains with FSDP). Set up by this module rather than by accelerate's FSDP
  plugin: accelerate enters its FSDP path only for GPU-type process groups, and a CPU run
  (``Accelerator(cpu=True)``) is ``MULTI_CPU``, which ignores the FSDP config; calling
  ``fully_shard`` directly is the same engine on CPU (gloo) and GPU (NCCL), so the tests
  here exercise the code a GPU run executes. An accelerate config with ``distributed_type:
  FSDP`` (``configs/accelerate/*-fsdp.yaml``) still works as the launcher and switches
  sharding on (`from_launcher`); its other FSDP settings are not read.
- **All four models** (`shard_models`): policy and critic sharded with their optimizer
  states (the optimizers are built on the sharded parameters); the reference and reward
  model sharded too, without optimizer, or with their shards kept in CPU memory and moved
  to the device one block at a time (`PPOConfig.offload_frozen_models`; FSDP's
  ``CPUOffloadPolicy``). On-policy distillation's teacher (`PPOConfig.teacher_model_path`)
  is a fifth, frozen model, sharded and offloaded as the reference is. LoRA composes: the frozen base weights and the adapters are
  sharded alike and only the adapters get gradients and AdamW state.
- **Mixed precision through FSDP** (`mixed_precision_policy`): ``mixed_precision="bf16"``
  becomes FSDP's ``MixedPrecisionPolicy``: bf16 copies of the gathered weights for compute,
  the sharded fp32 master weights (`model_dtype`) for the optimizer, and gradient
  reductions in fp32. ``"fp16"`` is refused (its loss scaler is not built for sharded
  gradients).
- **Sampling**: Hugging Face ``generate`` on the sharded model, every rank stepping its
  forward together until all ranks' responses have ended (``synced_gpus``, switched on by
  `mark_sharded`); the lean sampler and the lean forward decline sharded models (they read
  weights outside the modules' forward, where FSDP has them gathered) and the plain paths
  run instead.
- **Checkpoints** (`consolidated_state_dict`, `save_sharded`, `load_sharded`): the policy
  and critic are gathered into ordinary Hugging Face directories that ``from_pretrained``
  loads; the training state (shards of weights and AdamW moments) is written with
  ``torch.distributed.checkpoint`` into ``sharded/``, one file per rank, and loaded back
  into the same shards for an exact resume with the same number of processes.

With one process nothing is split: `sharded` is False and the run is the plain one.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
from torch import nn

from ppo.parallel import distributed

# transformers' generate() runs every rank's forward until all ranks are done when it sees
# this attribute (transformers.distributed.fsdp.is_fsdp_managed_module).
GENERATE_SYNC_ATTRIBUTE = "_is_fsdp_managed_module"


def from_launcher(config):
    """`config` with ``sharding="fsdp"`` when ``accelerate launch`` ran an FSDP config
    (``distributed_type: FSDP``, which sets ``ACCELERATE_USE_FSDP``); otherwise as it is.
    Only that switch is read: the sharding itself is this module's (see the docstring)."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and config.sharding == "none":
        return config.replace(sharding="fsdp")
    return config


def sharded(config) -> bool:
    """Whether this run shards its models: `sharding` "fsdp" and more than one process."""
    return config.sharding == "fsdp" and distributed.is_distributed()


def is_sharded(model) -> bool:
    """Whether `model` (or the policy behind a LoRA reference) was sharded by `shard`."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(getattr(model, "peft_model", model), FSDPModule)


def mixed_precision_policy(mixed_precision: str):
    """FSDP's precision policy for `PPOConfig.mixed_precision`: bf16 compute, fp32 reductions."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if mixed_precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if mixed_precision == "fp16":
        raise ValueError("PPOConfig.mixed_precision: 'fp16' needs a loss scaler, which sharded gradients "
                         "(sharding='fsdp') do not get here; use 'bf16'")
    return MixedPrecisionPolicy()


def block_classes(model: nn.Module) -> set[type]:
    """The transformer-block classes of every Hugging Face model inside `model`."""
    names = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return {type(m) for m in model.modules() if type(m).__name__ in names}


@functools.cache
def _mesh(device_type: str):
    """All processes in one dimension, on `device_type`: left to FSDP, the mesh would be on a
    GPU even in a --device cpu run."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (distributed.world_size(),))


def shard(model: nn.Module, mixed_precision: str, device: torch.device, offload: bool = False) -> nn.Module:
    """``fully_shard`` every transformer block of `model`, then `model` itself (in place),
    over all processes, its shards on `device` (or in CPU memory with `offload`)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    blocks = block_classes(model)
    if not blocks:
        raise ValueError(f"PPOConfig.sharding: found no transformer blocks in {type(model).__name__} (it lists no "
                         "_no_split_modules) to shard")
    options = dict(mesh=_mesh(torch.device(device).type), mp_policy=mixed_precision_policy(mixed_precision))
    if offload:
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    # Every rank keeps its own slice of what it built, so all must start from rank 0's weights
    # (DDP broadcasts them when it wraps a model): LoRA's A matrices and a random critic are
    # drawn from each rank's own seed.
    distributed.broadcast_tensors_([*model.parameters(), *model.buffers()])
    for module in list(model.modules()):
        if type(module) in blocks:
            fully_shard(module, **options)
    fully_shard(model, **options)
    if not any(p.requires_grad for p in model.parameters()):
        # FSDP keeps the root unit (embeddings, final norm, heads) gathered after a forward,
        # for the backward that follows in training; a frozen model has none, so it gives
        # the gathered weights back at once.
        model.register_forward_hook(lambda module, args, output: module.reshard())
    mark_sharded(model)
    return model


def reshard(*models) -> None:
    """Put sharded models' weights back in shards (the root unit stays gathered after a
    forward); reading parameters directly (`ref_update_every`) needs them sharded alike."""
    from torch.distributed.fsdp import FSDPModule

    for model in models:
        if isinstance(model, FSDPModule):
            model.reshard()


def mark_sharded(model: nn.Module) -> None:
    """Tell transformers' generate() to keep ranks in step (see `GENERATE_SYNC_ATTRIBUTE`)."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            setattr(module, GENERATE_SYNC_ATTRIBUTE, True)


def shard_models(config, device, policy, value_model, ref_policy, reward_model, teacher=None) -> None:
    """Shard the run's models in place (see the module docstring); a distillation `teacher`
    is frozen and sharded like the reference."""
    for trained in (policy, value_model):
        if trained is not None:
            shard(trained, config.mixed_precision, device)
    for frozen in (ref_policy, reward_model, teacher):
        if frozen is not None:
            shard(frozen, config.mixed_precision, device, offload=config.offload_frozen_models)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded tensor (DTensor); any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


# ---- memory ----------------------------------------------------------------------------
def training_memory(models: list, optimizers: list) -> dict[str, int]:
    """Bytes this process holds in parameters, gradients and optimizer state (its shards only)."""
    def size(t):
        t = local(t)
        return t.numel() * t.element_size()

    params = {id(p): p for m in models if m is not None for p in m.parameters()}
    state = [v for opt in optimizers if opt is not None for s in opt.state.values() for v in s.values()
             if torch.is_tensor(v) and v.dim() > 0]  # AdamW's moments; its scalar step counts are negligible
    return {"parameters": sum(size(p) for p in params.values()),
            "gradients": sum(size(p.grad) for p in params.values() if p.grad is not None),
            "optimizer_state": sum(size(v) for v in state)}


# ---- checkpoints -------------------------------------------------------------------------
def consolidated_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The whole state dict of a sharded model, on CPU, on the main process (None elsewhere).
    Every rank must call it: the shards are gathered."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return full if distributed.is_main_process() else None


def _training_state(policy, value_model, optimizers: list):
    """The trained models (one module, so one optimizer may span both) and their optimizers."""
    models = nn.ModuleDict({name: model for name, model in (("policy", policy), ("value", value_model))
                            if model is not None})
    return models, optimizers


def _state_dicts(models: nn.ModuleDict, optimizers: list, reference: nn.Module | None) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    # Frozen weights (LoRA's base model) are the warm start's: rebuilt, never saved twice.
    options = StateDictOptions(ignore_frozen_params=True)
    model_state, optimizer_state = get_state_dict(models, optimizers, options=options)
    state = {"models": model_state, "optimizers": optimizer_state}
    if reference is not None:
        state["reference"] = get_model_state_dict(reference)  # a moved reference is training state
    return state


def save_sharded(path: Path, policy, value_model, optimizers: list, reference=None) -> None:
    """Write every rank's shards of the policy's and critic's weights and of their
    `optimizers`' state into `path` (collective); also the `reference`'s, when it moves
    (`ref_update_every`)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state_dicts(*_training_state(policy, value_model, optimizers), reference), checkpoint_id=str(path))


def load_sharded(path: Path, policy, value_model, optimizers: list, reference=None) -> None:
    """Load `save_sharded`'s files back into this run's shards (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    models, optimizers = _training_state(policy, value_model, optimizers)
    state = _state_dicts(models, optimizers, reference)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(models, optimizers, model_state_dict=state["models"], optim_state_dict=state["optimizers"],
                   options=StateDictOptions(ignore_frozen_params=True))
    if "reference" in state:
        set_model_state_dict(reference, state["reference"])


def check_resume_layout(saved: dict, config, path: Path) -> None:
    """A checkpoint resumes under the sharding that wrote it, a sharded one on the same number
    of processes (its shards and every rank's RNG streams are per rank); anything else is
    refused, naming both layouts. `saved` is the checkpoint's ``state.json``."""
    from ppo.run.run_dir import RunDirectoryError

    def layout(sharding: str, processes: int) -> str:
        return f"sharding={sharding!r} on {processes} process{'es' if processes != 1 else ''}"

    now_sharded, was_sharded = sharded(config), saved.get("sharding", "none") == "fsdp"
    world, saved_world = distributed.world_size(), saved.get("world_size", 1)
    if was_sharded == now_sharded and (not now_sharded or saved_world == world):
        return
    raise RunDirectoryError(
        f"{path}: written with {layout(saved.get('sharding', 'none'), saved_world)}, resumed with "
        f"{layout('fsdp' if now_sharded else 'none', world)}; a checkpoint resumes only under the sharding that "
        "wrote it, and a sharded one only on as many processes (its policy/ and value/ folders are whole Hugging "
        "Face models: start a new run from them with --model-path to change either)")
