"""LoRA through `peft`: train low-rank adapters, and get the reference model for free.

Implementation details that live here:

- **LoRA on the policy** (`PPOConfig.lora_r`, `lora_alpha`, `lora_target_modules`): the
  base weights are frozen and each targeted linear layer learns ``W + (alpha / r) B A``
  with ``B`` initialised to zero, so training starts exactly at the SFT policy. Only
  ``A`` and ``B`` get gradients and AdamW state (Hu et al. 2021; TRL and OpenRLHF offer it).
- **The reference is the base model with the adapter disabled** (`AdapterDisabledReference`):
  RLHF's frozen reference *is* the initial policy, which is what the frozen base computes.
  No second copy of the weights is held. Memory saved against full fine-tuning, for P
  policy parameters in fp32 and Adam: the reference copy (4P bytes), the policy's
  gradients (4P) and Adam's two moments (8P), i.e. 16P bytes, minus the adapters' own
  (a fraction of a percent of P at rank 8).
- **LoRA on the critic** (`PPOConfig.lora_critic`): the critic's backbone (a copy of the
  policy's or the reward model's) gets its own adapters; its scalar head stays fully
  trainable. Saves the critic's gradients and Adam state; the backbone copy remains.
- **Checkpoints stay plain HF models** (`save_policy`): the merged weights
  ``W + (alpha / r) B A`` are written as an ordinary ``save_pretrained`` directory that
  `AutoModelForCausalLM.from_pretrained` loads without peft; the adapter itself goes to
  ``adapter/`` next to them, and resuming loads only that (`load_policy_weights`).
"""

from __future__ import annotations

from pathlib import Path

import torch


def _peft():
    try:
        import peft
    except ImportError as error:  # an optional dependency: name the field that needs it
        raise ImportError("PPOConfig.lora_r > 0 needs the 'peft' package (pip install 'ppo-details[lora]')") from error
    return peft


def target_modules(spec: str):
    """``"all-linear"`` (every linear layer but the output head) or a comma-separated list."""
    return spec if spec == "all-linear" else [name.strip() for name in spec.split(",") if name.strip()]


def apply_lora(model: torch.nn.Module, r: int, alpha: float, targets: str, task_type: str | None = "CAUSAL_LM"):
    """Wrap `model` in a peft `PeftModel` with fresh LoRA adapters (B = 0: output unchanged)."""
    peft = _peft()
    config = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=target_modules(targets),
                             task_type=task_type, bias="none")
    return peft.get_peft_model(model, config)


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


class AdapterDisabledReference:
    """The frozen reference as the policy's base model with its adapters switched off.

    Call it like a model; it runs `policy` (the prepared module, so under the same
    autocast) inside peft's ``disable_adapter()`` context, which skips every LoRA branch
    and computes exactly the initial weights.
    """

    def __init__(self, policy, peft_model):
        self.policy = policy  # what to call (possibly wrapped by accelerate)
        self.peft_model = peft_model  # what owns the adapters

    def __call__(self, *args, **kwargs):
        with self.peft_model.disable_adapter():
            return self.policy(*args, **kwargs)

    def eval(self):
        return self

    def parameters(self):
        return self.peft_model.parameters()


def merged_state_dict(peft_model, full: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The base model's state dict (original key names) with every adapter merged in.

    `full`: the peft model's whole state dict, gathered from a sharded model (whose own
    weights are shards); the merge ``W + scaling * B A`` is then made from its tensors."""
    from peft.tuners.lora import LoraLayer
    from peft.utils.save_and_load import get_base_model_state_dict

    adapter = peft_model.active_adapter
    layers = {name: module for name, module in peft_model.base_model.model.named_modules()
              if isinstance(module, LoraLayer) and adapter in module.lora_A}
    if full is None:
        state = get_base_model_state_dict(peft_model)
        for name, module in layers.items():
            weight = module.get_base_layer().weight
            state[f"{name}.weight"] = (weight + module.get_delta_weight(adapter).to(weight.dtype)).detach()
        return state
    inner = {key.removeprefix("base_model.model."): value for key, value in full.items()}
    state = {key.replace(".base_layer.", "."): value for key, value in inner.items() if ".lora_" not in key}
    for name, module in layers.items():
        if not isinstance(module.get_base_layer(), torch.nn.Linear):
            raise ValueError(f"PPOConfig.lora_target_modules: {name} is not a linear layer; a sharded LoRA policy "
                             "(sharding='fsdp') merges linear adapters only")
        delta = inner[f"{name}.lora_B.{adapter}.weight"] @ inner[f"{name}.lora_A.{adapter}.weight"]
        delta = (delta.T if module.fan_in_fan_out else delta) * module.scaling[adapter]
        weight = state[f"{name}.weight"]
        state[f"{name}.weight"] = weight + delta.to(weight.dtype)
    return state


def save_policy(model, path: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """``save_pretrained`` for a plain or a LoRA policy (merged weights plus ``adapter/``);
    `state_dict` is the model's whole state when its own weights are shards."""
    path = Path(path)
    if not is_lora(model):
        model.save_pretrained(path, **({} if state_dict is None else {"state_dict": state_dict}))
        return
    base = model.get_base_model()
    base.save_pretrained(path, state_dict={k: v.contiguous() for k, v in merged_state_dict(model, state_dict).items()})
    model.save_pretrained(path / "adapter", **({} if state_dict is None else {"state_dict": state_dict}))


def load_policy_weights(model, path: str | Path, skip: tuple[str, ...] = ()) -> None:
    """Restore a checkpoint written by `save_policy` into `model` (resume); files named in
    `skip` (e.g. a critic's head) are left out."""
    from safetensors.torch import load_file

    path = Path(path)
    if is_lora(model):
        from peft import set_peft_model_state_dict

        files = sorted((path / "adapter").glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{path / 'adapter'}: no adapter weights to resume the LoRA policy from")
        state = {}
        for file in files:
            state.update(load_file(str(file)))
        result = set_peft_model_state_dict(model, state)
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"{path / 'adapter'}: adapter keys do not match the policy: {result.unexpected_keys[:3]}")
        return
    state = {}
    for file in sorted(path.glob("*.safetensors")):
        if file.name not in skip:
            state.update(load_file(str(file)))
    if not state:
        raise FileNotFoundError(f"{path}: no safetensors weights")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"{path}: checkpoint keys the policy does not have: {unexpected[:3]}")


def trainable_parameter_count(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    parameters = list(model.parameters())
    return sum(p.numel() for p in parameters if p.requires_grad), sum(p.numel() for p in parameters)
