"""The teacher-forced forward passes of a step, with every exact speed path behind one object.

A step runs four kinds of pass over its rollout: the old policy's log-probs, the frozen
reference's log-probs and the old critic's values (phase 3, no autograd), then the update's
log-probs, entropies and values (with autograd). `RLTrainer.train_step` asks for each by
name and never sees how it is computed:

    old_logprobs = passes.old_logprobs(rollout)   # [B, T]
    ref_logprobs = passes.ref_logprobs(rollout)   # [B, T] or None (beta = 0)
    values = passes.values(rollout)               # [B, T] or None (no critic)
    outputs = passes.update(micro_batch)          # logprobs, entropy (and values) [b, T]

The speed paths, each exact (a test compares it on and off) and each a `PPOConfig` field:

- `reuse_update_forward`: the policy cannot move before the update's first optimizer step,
  so the update's first micro-batch is drawn early (the first epoch's shuffle, peeked at
  without consuming the generator: the buffer draws the very same order) and its forward
  pass with autograd also gives those rows' old log-probs and values; the old passes run
  over the other rows only, and `update` hands the kept outputs to that micro-batch
  (tests/test_lean_forward.py `test_reusing_the_update_forward_changes_nothing`).
- `lean_forward`, `share_prompt_prefix`, `padding_free`, `paired_critic_pass`,
  `compile_forward`: how each pass runs through the model (`ppo.speed.lean_forward`, enabled on
  the models at set-up; `ppo.models.logprobs` picks the path per call).
- `logprobs_from_generation` (TRL's choice, not a speed path): old log-probs from the
  sampler's logits instead of a pass.
- Where the critic looks (algorithm, not speed): `value_loss_over_padding` runs the critic
  over the whole padded width (AlpacaFarm), `score_position="after_last_token"` one column
  past the last token (TRL); either way the policy's passes are unchanged and the critic's
  update pass runs apart from the policy's (`_critic_values`).

The KL to the reference (`kl_estimate`, `kl_loss_inputs`): the estimator in use from the
old and reference log-probs (`ppo.algorithm.kl.kl_penalty`), and, for `kl_estimator="full"` or
`log_full_kl`, the exact KL over the vocabulary from both models' full log-softmax
(`response_log_softmax`, two extra no-grad passes; with "full" in the loss, one more policy
pass with autograd per micro-batch and the reference's ``[B, T, V]`` kept in the buffer).

On-policy distillation (`distillation_loss`, `PPOConfig.distill_coef` / `distill_only`): at
each update micro-batch the policy's full log-softmax (with autograd, one more pass) and the
frozen teacher's (no autograd, under `teacher_forward` in the step's times) over the
rollout's own tokens, and the exact reverse KL between them (`ppo.algorithm.distillation`).
The teacher scores the student's samples, never its own: the states are the student's.

Reference refresh (`refresh_reference`, `ref_update_every` / `ref_update_alpha`): the frozen
reference moved to (or toward) the current policy every so many steps.

Each pass counts its wall time towards its phase (`time_policy_forward`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ppo.parallel import distributed, sharding
from ppo.speed import lean_forward
from ppo.algorithm.distillation import distillation_loss
from ppo.algorithm.kl import full_kl, kl_penalty
from ppo.speed.lean_forward import response_logits
from ppo.models.logprobs import (_pad_columns, _unpadded_inputs, logprobs_from_logits, padded_response_values, response_logprobs, response_logprobs_and_values,
                       response_values)
from ppo.models.policy import scoring_mode, set_training
from ppo.algorithm.rewards import score_positions
from ppo.models.rollout import Rollout


def rollout_args(rollout: Rollout) -> tuple:
    """The four ``[B, ...]`` tensors every pass takes: query ids and mask, response ids and mask."""
    return rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask


def response_log_softmax(model, query_ids, query_mask, response_ids, response_mask,
                         temperature: float = 1.0) -> torch.Tensor:
    """The full log-softmax at every response position, ``[B, T, V]`` (zeros on padding
    columns past every row's end), with or without autograd as the caller's context says."""
    width = response_ids.shape[1]
    inputs, query_length, response_ids = _unpadded_inputs(query_ids, query_mask, response_ids, response_mask)
    logits = response_logits(model, *inputs, query_length)  # [B, t, V]: position t predicts token t+1
    log_probs = F.log_softmax(logits.float() / temperature, dim=-1)  # [B, t, V]
    return F.pad(log_probs, (0, 0, 0, width - log_probs.shape[1]))  # [B, T, V]


@dataclass
class _ReusedForward:
    """The update's first micro-batch (`order`, in the micro-batch's order) and its pass:
    `outputs` (log-probs, entropies, values ``[b, T]``) over `rows` (the same rows, sorted),
    `update_outputs` in the micro-batch's order. `rest` are the rows the old passes still run."""

    order: torch.Tensor
    rows: torch.Tensor
    rest: torch.Tensor
    outputs: dict
    update_outputs: dict


class ForwardPasses:
    """The old, reference, value and update passes of one trainer (see the module docstring).

    Args:
        policy, value_model: the trained models as accelerate prepared them (the update's
            backward runs through them); `value_model` None without a critic.
        ref_policy: the frozen reference, or None when beta = 0.
        teacher: on-policy distillation's frozen teacher, or None when distillation is off.
        config: the run's `PPOConfig`.
        shuffle_generator: the buffer's minibatch-order generator (peeked at, never advanced).
        micro_batch_size: rows per update micro-batch for a local batch of a given size.
        timer: the trainer's `ppo.run.metrics.PhaseTimer`.
    """

    def __init__(self, policy, value_model, ref_policy, config, shuffle_generator: torch.Generator,
                 micro_batch_size, timer, teacher=None):
        self.policy, self.value_model, self.ref_policy, self.teacher = policy, value_model, ref_policy, teacher
        self.config = config
        self.shuffle_generator = shuffle_generator
        self.micro_batch_size = micro_batch_size
        self.timer = timer
        # Dropout would make the early pass differ from the old policy's (eval-mode) pass.
        self.reuses_update_forward = (
            config.reuse_update_forward and not config.logprobs_from_generation
            and not any(lean_forward.dropout_active(m) for m in (policy, value_model) if m is not None))
        self._reused: _ReusedForward | None = None
        self.kl_full: torch.Tensor | None = None  # [B, T] exact per-token KL of this step, when measured
        self.ref_log_probs_full: torch.Tensor | None = None  # [B, T, V] kept for "full" in the loss

    @property
    def temperature(self) -> float:
        """The temperature every pass divides the logits by (`scale_logits_by_temperature`)."""
        return self.config.temperature if self.config.scale_logits_by_temperature else 1.0

    # -- phase 3: the old policy, the reference and the old critic (no autograd) --------
    def old_logprobs(self, rollout: Rollout) -> torch.Tensor:
        """The behaviour policy's log-probs of the sampled tokens, ``[B, T]``."""
        self._reused = self._reuse_first_micro_batch(rollout) if self.reuses_update_forward else None
        with torch.no_grad(), scoring_mode(self.policy, self.value_model), self.timer("policy_forward"):
            if self.config.logprobs_from_generation and rollout.sampler_logprobs is not None:  # vLLM's own
                return rollout.sampler_logprobs
            if self.config.logprobs_from_generation:
                return logprobs_from_logits(rollout.generation_logits, rollout.response_ids, self.temperature)
            return self._old_pass(rollout, "logprobs", lambda *args: response_logprobs(
                self.policy, *args, temperature=self.temperature))

    def ref_logprobs(self, rollout: Rollout) -> torch.Tensor | None:
        """The frozen reference's log-probs, ``[B, T]``; None without a reference (beta = 0)."""
        if self.ref_policy is None:
            return None
        # With LoRA the reference is the policy itself (adapter off): its mode matters too.
        with torch.no_grad(), scoring_mode(self.policy, self.value_model), self.timer("reference_forward"):
            return response_logprobs(self.ref_policy, *rollout_args(rollout), temperature=self.temperature)

    def values(self, rollout: Rollout) -> torch.Tensor | None:
        """The old critic's values, zero outside the positions it covers (`_critic_values`),
        ``[B, T]``; None without a critic."""
        if self.value_model is None:
            return None
        with torch.no_grad(), scoring_mode(self.policy, self.value_model), self.timer("value_forward"):
            values = self._old_pass(rollout, "values", self._critic_values)
        if self.config.value_loss_over_padding:
            return values
        return values * score_positions(rollout.response_mask, self.config.score_position).float()

    def _critic_values(self, query_ids, query_mask, response_ids, response_mask) -> torch.Tensor:
        """The critic's pass, ``[B, T]``: over the real tokens, one column past them for TRL's
        score position (PPOConfig.score_position), or AlpacaFarm's whole padded width
        (PPOConfig.value_loss_over_padding)."""
        if self.config.value_loss_over_padding:
            return padded_response_values(self.value_model, query_ids, query_mask, response_ids, response_mask)
        critic_mask = score_positions(response_mask, self.config.score_position)
        return response_values(self.value_model, query_ids, query_mask, response_ids, critic_mask)

    # -- phase 4: the KL to the reference ---------------------------------------------------
    def kl_estimate(self, rollout: Rollout, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
        """Per-token KL to the reference by `kl_estimator`, ``[B, T]`` (unmasked). Measures
        `kl_full` too when the estimator is "full" or `log_full_kl` asks for it."""
        cfg = self.config
        self.kl_full = self.ref_log_probs_full = None
        if cfg.kl_estimator != "full" and not cfg.log_full_kl:
            return kl_penalty(old_logprobs, ref_logprobs, cfg.kl_estimator, cfg.kl_clip_at_zero)
        with torch.no_grad(), scoring_mode(self.policy, self.value_model), self.timer("reference_forward"):
            args = rollout_args(rollout)
            policy = response_log_softmax(self.policy, *args, temperature=self.temperature)  # [B, T, V]
            reference = response_log_softmax(self.ref_policy, *args, temperature=self.temperature)  # [B, T, V]
        self.kl_full = full_kl(policy, reference) * rollout.response_mask.float()  # [B, T]
        if cfg.kl_estimator != "full":
            return kl_penalty(old_logprobs, ref_logprobs, cfg.kl_estimator, cfg.kl_clip_at_zero)
        if cfg.kl_placement == "loss":
            self.ref_log_probs_full = reference
        return self.kl_full.clamp(min=0.0) if cfg.kl_clip_at_zero else self.kl_full

    def kl_metrics(self) -> dict[str, float]:
        """``{"kl_full": mean sequence KL over the vocabulary}`` when measured this step, else {}."""
        if self.kl_full is None:
            return {}
        return {"kl_full": float(distributed.global_mean(self.kl_full.sum(-1)))}

    def kl_loss_inputs(self, micro: dict) -> dict:
        """What `ppo.algorithm.losses.kl_loss` needs beyond the sampled tokens' log-probs: the old
        log-probs for the importance weight, the policy's full log-softmax (autograd) and the
        reference's for "full"."""
        cfg, inputs = self.config, {}
        if cfg.kl_loss_importance_weight:
            inputs["old_logprobs"] = micro["old_logprobs"]
        if cfg.kl_estimator == "full":
            args = tuple(micro[name] for name in ("query_ids", "query_mask", "response_ids", "response_mask"))
            inputs["log_probs"] = response_log_softmax(self.policy, *args, temperature=self.temperature)
            inputs["ref_log_probs"] = micro["ref_log_probs_full"]
        return inputs

    # -- on-policy distillation ------------------------------------------------------------
    def distillation_loss(self, micro: dict, **agg) -> tuple[torch.Tensor, float, float]:
        """The reverse KL(policy || teacher) of a micro-batch, exact over the vocabulary at each
        of its loss tokens, aggregated as the policy loss is (`agg`: loss_agg, ...), with
        autograd through the policy (`ppo.algorithm.distillation.distillation_loss`); and the
        per-token KL summed over those tokens with their count, for ``distill_kl``, a mean over
        real tokens whatever `loss_agg` and however the batch is split."""
        args = tuple(micro[name] for name in ("query_ids", "query_mask", "response_ids", "response_mask"))
        log_probs = response_log_softmax(self.policy, *args, temperature=self.temperature)  # [b, T, V]
        with torch.no_grad(), self.timer("teacher_forward"):
            teacher_log_probs = response_log_softmax(self.teacher, *args, temperature=self.temperature)  # [b, T, V]
        loss, metrics = distillation_loss(log_probs, teacher_log_probs, micro["loss_mask"], **agg)
        tokens = float(micro["loss_mask"].sum())
        return loss, metrics["distill_kl"] * tokens, tokens

    def refresh_reference(self, steps_done: int) -> bool:
        """Move the reference toward the policy every `ref_update_every` steps: a hard reset
        (`ref_update_alpha` 1; slime, ProRL) or TR-DPO's soft mix ``ref <- a * pi + (1 - a) * ref``
        (TRL `SyncRefModelCallback`). Returns whether it moved."""
        cfg = self.config
        if not cfg.ref_update_every or self.ref_policy is None or steps_done % cfg.ref_update_every:
            return False
        if cfg.lora_r:
            raise ValueError("PPOConfig.ref_update_every: with LoRA the reference is the base model itself")
        sharding.reshard(self.policy, self.ref_policy)
        policy = dict(getattr(self.policy, "module", self.policy).named_parameters())
        with torch.no_grad():
            for name, ref_param in getattr(self.ref_policy, "module", self.ref_policy).named_parameters():
                source = policy[name]
                if source.shape != ref_param.shape:
                    raise ValueError(f"PPOConfig.ref_update_every: policy and reference differ at {name}")
                # Sharded (FSDP): both hold the same slice of the same layout; the reference's
                # may sit in CPU memory (offload_frozen_models).
                target = sharding.local(ref_param)
                target.mul_(1.0 - cfg.ref_update_alpha).add_(sharding.local(source).to(target.device, target.dtype),
                                                             alpha=cfg.ref_update_alpha)
        return True

    # -- phase 7: the update (autograd) ----------------------------------------------------
    def update(self, micro: dict) -> dict:
        """The update's log-probs and entropies (and, with a critic, values) of a micro-batch,
        ``[b, T]`` each, with autograd."""
        reused = self._reused
        if reused is not None and torch.equal(micro["rows"], reused.order):
            self._reused = None  # the pass ran before the advantages: it was the old policy's too
            return reused.update_outputs
        return self._update_pass(tuple(micro[name] for name in
                                       ("query_ids", "query_mask", "response_ids", "response_mask")))

    def _update_pass(self, args: tuple) -> dict:
        cfg = self.config
        critic_as_policy = not cfg.value_loss_over_padding and cfg.score_position == "last_token"
        if self.value_model is not None and critic_as_policy:  # one pass of both when paired (paired_critic_pass)
            return response_logprobs_and_values(self.policy, self.value_model, *args, temperature=self.temperature)
        logprobs, entropy = response_logprobs(self.policy, *args, temperature=self.temperature, with_entropy=True)
        if self.value_model is None:
            return {"logprobs": logprobs, "entropy": entropy}
        return {"logprobs": logprobs, "entropy": entropy, "values": self._critic_values(*args)}

    # -- reuse_update_forward ---------------------------------------------------------------
    def _reuse_first_micro_batch(self, rollout: Rollout) -> _ReusedForward:
        """Run the update's first micro-batch's pass now (see the module docstring)."""
        state = self.shuffle_generator.get_state()
        order = torch.randperm(len(rollout.response_ids), generator=self.shuffle_generator)  # the first epoch's
        self.shuffle_generator.set_state(state)  # the buffer draws this same order
        size = self.micro_batch_size(len(order))
        # The pass sees its rows in the batch's own order, as the other passes see them (with
        # one minibatch: the very same batch, so the reference KL of an unmoved policy is 0).
        rows, position = order[:size].sort()
        inverse = torch.empty_like(position).scatter_(0, position, torch.arange(size))  # micro-batch row -> pass row
        device = rollout.response_ids.device
        rows, inverse = rows.to(device), inverse.to(device)
        with self.timer("update"):
            for model in (self.policy, self.value_model):
                if model is not None:
                    set_training(model, True)
            outputs = self._update_pass(tuple(t[rows] for t in rollout_args(rollout)))
        return _ReusedForward(order=order[:size], rows=rows, rest=order[size:].sort().values.to(device),
                              outputs=outputs, update_outputs={name: value[inverse] for name, value in outputs.items()})

    def _old_pass(self, rollout: Rollout, name: str, run) -> torch.Tensor:
        """`run(*args)` over the rollout, or, with a reused forward, its detached outputs for
        its rows and `run` over the rest only."""
        args = rollout_args(rollout)
        reused = self._reused
        if reused is None:
            return run(*args)
        first = reused.outputs[name].detach()  # [b, T]
        out = first.new_empty(len(args[0]), *first.shape[1:])
        out[reused.rows] = first
        if len(reused.rest):
            out[reused.rest] = run(*(t[reused.rest] for t in args))
        return out

    def sampling_temperature_kl(self, rollout: Rollout, kl_k1: torch.Tensor) -> torch.Tensor:
        """Per-token k1 KL to the reference at the *sampling* temperature, ``[B, T]``.

        `kl_k1` is measured at the temperature the loss uses: the sampling temperature with
        `scale_logits_by_temperature`, else 1. Runs that differ in that toggle would compare
        KLs of different distributions; this one is the same quantity for both (the KL of
        the distributions actually sampled from), at the cost of two extra no-grad passes
        when the two temperatures differ.
        """
        cfg = self.config
        if cfg.scale_logits_by_temperature or cfg.temperature == 1.0:
            return kl_k1
        with torch.no_grad(), scoring_mode(self.policy, self.value_model):
            args = rollout_args(rollout)
            policy = response_logprobs(self.policy, *args, temperature=cfg.temperature)
            reference = response_logprobs(self.ref_policy, *args, temperature=cfg.temperature)
        return (policy - reference) * rollout.response_mask.float()
