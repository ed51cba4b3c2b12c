"""Building a run's models and optimizers: the policy, its frozen reference, the critic, the
reward model, AdamW and the learning-rate schedules, placed by accelerate.

Implementation details that live here:

- **The warm start** (`PPOConfig.model_path`, `warm_start_steps`): a local HF checkpoint,
  or the testbed's cached SFT model (`ppo.models.sft.warm_start`), found before seeds are set.
- **The reference is the initial policy** (`uses_reference_model`): a frozen deep copy; with
  LoRA the policy's own base model with the adapter disabled (`ppo.models.lora`); none at beta = 0.
- **The critic's initialisation** (`PPOConfig.value_init`): from the reward model with a
  zeroed head (AlpacaFarm), from the policy with a zeroed head, or random (`value_model/`).
- **The reward model** (`PPOConfig.reward_model_path`, `load_reward_model`): a scalar-head
  model scores the rollout's token ids (refused when its files are not the ones its build
  recorded: `value_model.reward_model.check_reward_model_digests`); a Hugging Face sequence-classification checkpoint
  (TRL's RewardTrainer output) scores text through its own tokenizer
  (`Models.reward_model_scores`, value_model/hf_reward.py).
- **Dropout off** (`disable_dropout`), gradient checkpointing and LoRA (memory toggles).
- **Frozen models under the policy's autocast** (`ppo.models.precision.prepare_frozen`): otherwise
  bf16 fakes a KL at step 1.
- **The lean forward** (`lean_forward`, `paired_critic_pass`, ...): switched on here for the
  models it supports; `ppo.models.forward_passes` is where a step meets it. The reference takes the
  path the policy's passes take: when those run through the HF forward (gradient
  checkpointing, a DDP wrapper) so does the reference, or float rounding fakes a step-1 KL.
- **Token ids fit the embedding** (`check_token_ids`): a tokenizer's pad id past the
  embedding matrix grows a loaded policy's matrix, or is refused with what to do.
- **The teacher of on-policy distillation** (`PPOConfig.teacher_model_path`, `distill_coef`,
  `distill_only`): loaded frozen beside the reference when distillation is on, its vocabulary
  checked against the policy's (`ppo.models.teacher`); "testbed" names the project's own
  teacher, built on first use by the main process (`teacher_path`).
- **Sharded models** (`PPOConfig.sharding`): with "fsdp" the four models (and the teacher) are
  sharded across the processes (`build_sharded`, ppo/parallel/sharding.py) instead of being
  wrapped by accelerate.
- **Special tokens spelled in prompt text** (`PPOConfig.split_special_tokens`): by default
  ``'hello<eos>world'`` is encoded with the EOS token inside the prompt (the tokenizer's
  usual rule); True encodes such text as the characters it is made of.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from value_model import ScalarHeadModel
from value_model.hf_reward import SequenceClassifierReward, is_sequence_classifier
from value_model.reward_model import check_reward_model_digests, last_token_scores

from ppo.parallel import distributed, sharding
from ppo.speed import lean_forward
from ppo.models.lora import AdapterDisabledReference, apply_lora
from ppo.models.optimization import Optimizers, build_lr_scheduler, build_optimizers
from ppo.models.policy import (declared_stop_token_ids, disable_dropout, enable_gradient_checkpointing, load_policy,
                               resolve_max_prompt_length, set_training)
from ppo.models.precision import cast_master_weights, master_dtype, prepare_frozen
from ppo.models.teacher import load_teacher, resolve_teacher_path


def warm_start_path(config) -> str:
    """`config.model_path`, or the testbed's cached SFT warm start (built if missing: the
    main process builds or finds it, the others wait for it)."""
    if config.model_path is not None:
        return config.model_path
    from ppo.models.sft import warm_start

    model_path = None
    if distributed.is_main_process():
        model_path = str(warm_start(progress=config.progress, stop_after=config.warm_start_steps))
    return distributed.broadcast_object(model_path)


def teacher_path(config) -> str | None:
    """The teacher's directory when distillation is on (`PPOConfig.distill_coef`,
    `distill_only`), else None. ``"testbed"`` is the project's teacher: the main process
    builds it the first time, the others wait for its path; a directory that does not exist
    is refused, naming it."""
    if not (config.distill_only or config.distill_coef > 0):
        return None
    path = None
    if distributed.is_main_process():
        path = str(resolve_teacher_path(config.teacher_model_path, progress=config.progress))
    return distributed.broadcast_object(path)


def check_stop_token_ids(stop_token_ids: list[int] | None, policy, tokenizer) -> None:
    """Refuse stop ids the model can never sample (beyond its vocabulary): such a stop token
    would never end a response, so every one would run to response_length."""
    vocab = max(len(tokenizer), getattr(getattr(policy, "config", None), "vocab_size", 0) or 0)
    outside = [i for i in stop_token_ids or [] if i >= vocab]
    if outside:
        raise ValueError(f"PPOConfig.stop_token_ids: {outside} lie outside the model's vocabulary of {vocab} ids, so "
                         f"they can never be sampled and would end no response; use ids below {vocab}, None for the "
                         "checkpoint's EOS ids, or [] for no stop token")


@dataclass
class Models:
    """A run's models and what trains them, built once by `build_models`.

    The tokenizer and what it settles up front (checked against the model's context):
    ``tokenizer``, ``stop_token_ids`` (``[]``: no stop token), ``max_prompt_length``, and
    ``model_path`` (the warm start loaded; None for a policy passed in as an object). The
    models: ``policy`` and ``value_model`` as accelerate prepared them (the update's
    backward runs through them; ``value_model`` None without a critic), ``policy_module`` and
    ``value_module`` unwrapped (sampling, evaluation, checkpoints), the frozen ``ref_policy``
    (None when beta = 0), ``reward_model`` (None unless `reward_model_path`) and ``teacher``
    (on-policy distillation's, None unless it is on), all placed on ``device``.
    ``optimizers``: AdamW and the learning-rate schedules.
    """

    model_path: str | None
    tokenizer: object
    stop_token_ids: list[int]
    max_prompt_length: int | None
    device: torch.device
    policy: torch.nn.Module
    policy_module: torch.nn.Module
    value_model: torch.nn.Module | None
    value_module: torch.nn.Module | None
    ref_policy: torch.nn.Module | None
    reward_model: torch.nn.Module | None
    optimizers: Optimizers
    reward_reads_text: bool = False  # a sequence-classification reward model: scores text, own tokenizer
    teacher: torch.nn.Module | None = None  # frozen; scores the policy's samples for on-policy distillation

    def set_training(self, mode: bool) -> None:
        """Policy and critic in train (or eval) mode (`ppo.models.policy.set_training`)."""
        for model in (self.policy, self.value_model):
            if model is not None:
                set_training(model, mode)

    @torch.no_grad()
    def reward_model_scores(self, rollout, problems, responses: list[str]) -> torch.Tensor:
        """The reward model's score of each response, ``[B]`` (as in its training): a
        scalar-head model's output at the last response token of the rollout's ids; a
        sequence-classification model's score of the text, prompts as written in the data
        and decoded responses, through its own tokenizer (value_model/hf_reward.py)."""
        if self.reward_reads_text:
            prompts = [p.meta.get("raw_prompt", p.prompt) for p in problems]  # before the policy's chat template
            return self.reward_model(prompts, list(responses)).float()  # [B]
        return last_token_scores(self.reward_model, rollout.query_ids, rollout.query_mask, rollout.response_ids,
                                 rollout.response_mask)


def build_models(config, accelerator, model_path: str | None, policy=None, tokenizer=None) -> Models:
    """Load (from `model_path`) or take the policy and build everything around it (`Models`).

    The tokenizer's settings are settled and checked against the policy's context first;
    then the reference, the critic, the reward model and the optimizers; then accelerate
    prepares the trained models (or, under `PPOConfig.sharding` "fsdp", `build_sharded`
    shards all four), and the lean forward is switched on where it applies.
    """
    if policy is None:
        policy, tokenizer = load_policy(model_path, dropout=not config.disable_dropout,
                                        dtype=master_dtype(config.model_dtype),
                                        attn_implementation=config.attn_implementation)
    elif tokenizer is None:
        raise ValueError("pass the tokenizer together with the policy")
    else:
        model_path = None
        cast_master_weights(policy, config.model_dtype)
        if config.disable_dropout:
            disable_dropout(policy)
    check_token_ids(policy, tokenizer, resize=model_path is not None)
    # Prompt text such as '<eos>' is the special token by default, its characters with True.
    tokenizer.split_special_tokens = config.split_special_tokens
    settled = dict(model_path=model_path, tokenizer=tokenizer, device=accelerator.device,
                stop_token_ids=(declared_stop_token_ids(policy, tokenizer) if config.stop_token_ids is None
                                else config.stop_token_ids))  # [] = no stop token
    check_stop_token_ids(config.stop_token_ids, policy, tokenizer)
    settled["max_prompt_length"] = resolve_max_prompt_length(policy, config.max_prompt_length, config.response_length)
    ref_policy = None
    if config.uses_reference_model and not config.lora_r:
        ref_policy = copy.deepcopy(policy).eval().requires_grad_(False)
    value_model = build_value_model(config, policy, accelerator.device, tokenizer) if config.uses_value_model else None
    policy = apply_memory_toggles(config, policy, value_model)
    reward_model = load_reward_model(config) if config.reward_model_path else None
    settled["reward_reads_text"] = isinstance(reward_model, SequenceClassifierReward)
    teacher_dir = teacher_path(config)  # on-policy distillation: frozen like the reference, never trained
    teacher = (load_teacher(teacher_dir, policy, dtype=master_dtype(config.model_dtype),
                            attn_implementation=config.attn_implementation) if teacher_dir else None)

    if sharding.sharded(config):  # FSDP2: each process keeps 1/N of every model (ppo/parallel/sharding.py)
        return build_sharded(config, policy, value_model, ref_policy, reward_model, teacher=teacher, **settled)
    # The critic gets its own AdamW by default (separate_value_optimizer).
    policy_optimizer, value_optimizer = build_optimizers(config, policy, value_model)
    schedulers = [build_lr_scheduler(opt, config.lr_schedule, config.warmup_steps, config.total_steps)
                  for opt in (policy_optimizer, value_optimizer) if opt is not None]
    trained = [m for m in (policy, value_model, policy_optimizer, value_optimizer) if m is not None]
    prepared = iter(accelerator.prepare(*trained))
    policy = next(prepared)
    value_model = next(prepared) if value_model is not None else None
    policy_optimizer = next(prepared)
    value_optimizer = next(prepared) if value_optimizer is not None else None
    policy_module = accelerator.unwrap_model(policy)
    value_module = accelerator.unwrap_model(value_model) if value_model is not None else None
    parameters = [list(model.parameters()) if model is not None else [] for model in (policy, value_model)]
    if ref_policy is not None:
        ref_policy = prepare_frozen(accelerator, ref_policy)
    elif config.uses_reference_model:
        ref_policy = AdapterDisabledReference(policy, policy_module)
    reward_model = prepare_frozen(accelerator, reward_model) if reward_model is not None else None
    teacher = prepare_frozen(accelerator, teacher) if teacher is not None else None
    if config.lean_forward and config.mixed_precision == "no":  # autocast lives in the module call
        # The reference goes where the policy's own passes go (they run through
        # `Models.policy`: a DDP wrapper, or an HF forward under gradient checkpointing):
        # the same weights through two code paths differ in rounding, a fake step-1 KL.
        policy_lean = not lean_forward.enable(policy_module, compile=config.compile_forward,
                                              share_prompts=config.share_prompt_prefix,
                                              padding_free=config.padding_free)
        policy_lean = policy_lean and lean_forward.lean_backbone(policy) is not None
        lean_forward.enable(ref_policy if policy_lean else None, value_module, teacher,
                            compile=config.compile_forward, share_prompts=config.share_prompt_prefix,
                            padding_free=config.padding_free)
        if config.paired_critic_pass:  # one stacked update pass of policy and critic when shapes match
            lean_forward.pair(policy_module, value_module)
    return Models(**settled, policy=policy, policy_module=policy_module, value_model=value_model,
                  value_module=value_module, ref_policy=ref_policy, reward_model=reward_model, teacher=teacher,
                  optimizers=Optimizers(policy_optimizer, value_optimizer, schedulers, parameters))


def load_reward_model(config):
    """The frozen reward model at `config.reward_model_path`: a Hugging Face
    sequence-classification checkpoint (TRL's RewardTrainer output), or a scalar-head model."""
    kwargs = dict(dtype=master_dtype(config.model_dtype), attn_implementation=config.attn_implementation)
    if is_sequence_classifier(config.reward_model_path):
        if sharding.sharded(config):
            raise ValueError("PPOConfig.sharding: 'fsdp' shards scalar-head reward models only; a sequence-"
                             "classification reward model runs whole in each process: use sharding='none'")
        return SequenceClassifierReward.from_pretrained(config.reward_model_path, system_prompt=config.system_prompt,
                                                        **kwargs)
    check_reward_model_digests(config.reward_model_path)  # a built one records its files' digests
    return ScalarHeadModel.from_pretrained(config.reward_model_path, **kwargs).eval().requires_grad_(False)


def build_sharded(config, policy, value_model, ref_policy, reward_model, teacher=None, **settled) -> Models:
    """`build_models` under `PPOConfig.sharding` "fsdp": the four models (and a distillation
    teacher, sharded like the reference) sharded in place, the
    optimizers built on the shards; no accelerate wrapper (FSDP does the gradient reduction
    DDP would), and the plain Hugging Face forward and generate (the lean paths decline).
    `settled` holds the `Models` fields settled before the models were built (tokenizer, ...)."""
    sharding.shard_models(config, settled["device"], policy, value_model, ref_policy, reward_model, teacher)
    policy_optimizer, value_optimizer = build_optimizers(config, policy, value_model)
    schedulers = [build_lr_scheduler(opt, config.lr_schedule, config.warmup_steps, config.total_steps)
                  for opt in (policy_optimizer, value_optimizer) if opt is not None]
    parameters = [list(model.parameters()) if model is not None else [] for model in (policy, value_model)]
    if ref_policy is None and config.uses_reference_model:
        ref_policy = AdapterDisabledReference(policy, policy)
    return Models(**settled, policy=policy, policy_module=policy, value_model=value_model, value_module=value_model,
                  ref_policy=ref_policy, reward_model=reward_model, teacher=teacher,
                  optimizers=Optimizers(policy_optimizer, value_optimizer, schedulers, parameters))


def check_token_ids(policy, tokenizer, resize: bool) -> None:
    """The pad, EOS and BOS ids must index the policy's embedding matrix (else the first
    padded batch fails inside the embedding with an IndexError). A policy loaded here grows
    its matrix to the tokenizer (`resize`); a policy passed in is refused with what to do."""
    rows = policy.get_input_embeddings().weight.shape[0]
    named = {"pad": tokenizer.pad_token_id, "eos": tokenizer.eos_token_id, "bos": tokenizer.bos_token_id}
    outside = {name: token for name, token in named.items() if token is not None and token >= rows}
    if outside and resize and max(outside.values()) < len(tokenizer):
        policy.resize_token_embeddings(len(tokenizer))
        return
    if outside:
        listed = ", ".join(f"{name} id {token}" for name, token in outside.items())
        raise ValueError(f"the tokenizer's {listed} lies past the policy's embedding matrix ({rows} rows); "
                         "call policy.resize_token_embeddings(len(tokenizer)) before passing it in, or give the "
                         "tokenizer a pad token the model has an embedding for")


def build_value_model(config, policy, device, tokenizer=None) -> ScalarHeadModel:
    """The critic, initialised as `config.value_init` says."""
    from_reward_model = config.value_init in ("reward_model", "reward_model_head")
    if from_reward_model and is_sequence_classifier(config.reward_model_path):  # its backbone and score head
        from value_model.hf_reward import critic_from_sequence_classifier

        model = critic_from_sequence_classifier(config.reward_model_path, tokenizer,
                                                zero_head=config.value_init == "reward_model")
    elif from_reward_model:  # TRL keeps the trained head
        model = ScalarHeadModel.from_pretrained(config.reward_model_path, zero_head=config.value_init == "reward_model")
    elif config.value_init == "pretrained":  # VC-PPO value pretraining (python -m ppo.models.value_pretrain)
        model = ScalarHeadModel.from_pretrained(config.value_init_path)
    elif config.value_init == "policy":
        model = ScalarHeadModel.from_policy(policy, head_init="zero")
    else:
        model = ScalarHeadModel.random_like(policy)
    if config.disable_dropout:
        disable_dropout(model)
    return cast_master_weights(model, config.model_dtype).to(device)


def apply_memory_toggles(config, policy, value_model):
    """LoRA adapters (ppo/models/lora.py) and gradient checkpointing, on the policy and critic."""
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
        if value_model is not None:
            enable_gradient_checkpointing(value_model)
    if config.lora_r:
        policy = apply_lora(policy, config.lora_r, config.lora_alpha, config.lora_target_modules)
        if value_model is not None and config.lora_critic:
            value_model.backbone = apply_lora(value_model.backbone, config.lora_r, config.lora_alpha,
                                              config.lora_target_modules, task_type=None)
        if config.disable_dropout:
            disable_dropout(policy)
    return policy
