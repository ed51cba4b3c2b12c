"""Value pretraining (VC-PPO): fit the critic to Monte-Carlo returns of the initial policy.

VC-PPO (Yuan et al. 2025, "What's Behind PPO's Collapse in Long-CoT? Value Optimization Holds
the Secret", arXiv 2503.01491, section 4.1) traces PPO's early failures on long responses to
the critic's start: initialised from a reward model (or a zeroed head) it is wrong about
every state but the last, and with lambda < 1 those errors become the advantages of the
first tokens. Its fix is to train the critic alone, before RL, on rollouts of the frozen
initial policy with lambda = 1 targets (plain reward-to-go), and start PPO from that critic.

Run ``python -m ppo.models.value_pretrain`` (with ``--preset`` / ``--testbed`` / ``--set`` like
``ppo-train``) to build it; it prints the directory, which a run uses through
``value_init='pretrained'`` and ``value_init_path``. Like the SFT warm start (`ppo.models.sft`), the
result is cached under ``$PPO_CACHE_DIR/value_pretrain/<key>``, the key a digest of every
setting that changes it (`PRETRAIN_FIELDS` and the command's own), so a sweep's runs share
one critic and the path is known before it is built (`pretrained_critic_path`).

What happens: `rounds` rollout batches of the initial policy (its settings: prompts,
group size, temperature, response length) are scored as RL scores them (missing-EOS rule,
format reward, clipping; no KL: the policy is its own reference); their discounted
reward-to-go is the target of every response token; the critic, initialised as
`value_init` says, is fitted by `epochs` passes of minibatch MSE with AdamW at the
critic's learning rate. ``critic_info.json`` records the settings and the value error and
explained variance per epoch.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import math
import tempfile
from pathlib import Path

import torch

from gae import compute_gae

from ppo.config import PPOConfig
from ppo.models.logprobs import response_values
from ppo.algorithm.losses import explained_variance
from ppo.models.rollout import pad_to_width
from ppo.models.sft import DEFAULT_CACHE_DIR, save_atomically

# Bump when the recipe changes, so an old cached critic is not reused.
VALUE_PRETRAIN_VERSION = 1
# The run settings a pretrained critic depends on (the rollouts it sees, its targets, its start).
PRETRAIN_FIELDS = ("model_path", "warm_start_steps", "task", "task_path", "gsm8k_answer_mode", "reward_model_path",
                   "value_init", "rollout_batch_size", "group_size", "response_length", "temperature", "top_k", "top_p",
                   "scale_logits_by_temperature", "stop_token_ids", "max_prompt_length", "prompt_truncation",
                   "missing_eos", "missing_eos_penalty", "missing_eos_value", "format_reward_coef", "reward_clip",
                   "gamma", "num_minibatches", "lr", "value_lr", "adam_eps", "adam_beta1", "adam_beta2",
                   "weight_decay", "max_grad_norm", "model_dtype")


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    """The command's own settings (part of the cache key)."""

    rounds: int = 16  # rollout batches of the initial policy
    epochs: int = 8  # passes over all of them
    seed: int = 0


def _key(config: PPOConfig, settings: PretrainSettings) -> str:
    values = {name: getattr(config, name) for name in PRETRAIN_FIELDS}
    payload = {"version": VALUE_PRETRAIN_VERSION, "settings": dataclasses.asdict(settings), "config": values}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def pretrained_critic_path(config: PPOConfig, settings: PretrainSettings | None = None,
                           cache_dir: str | Path | None = None) -> Path:
    """Where `pretrain_critic` writes (or wrote) the critic for these settings; builds nothing."""
    return Path(cache_dir or DEFAULT_CACHE_DIR) / "value_pretrain" / _key(config, settings or PretrainSettings())


def pretrain_critic(config: PPOConfig, settings: PretrainSettings | None = None, cache_dir: str | Path | None = None,
                    force: bool = False) -> Path:
    """The directory of the pretrained critic for `config`, fitting it if it is not cached."""
    settings = settings or PretrainSettings()
    output_dir = pretrained_critic_path(config, settings, cache_dir)
    if (output_dir / "critic_info.json").is_file() and not force:
        return output_dir
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(output_dir.parent / f"{output_dir.name}.lock", "w") as lock:  # one builder, the others wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (output_dir / "critic_info.json").is_file() and not force:
                return output_dir
            return _fit_and_save(config, settings, output_dir)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _fit_and_save(config: PPOConfig, settings: PretrainSettings, output_dir: Path) -> Path:
    from ppo.trainer import RLTrainer  # the trainer builds the models exactly as a run does

    with tempfile.TemporaryDirectory() as scratch:
        run_config = config.replace(seed=settings.seed, output_dir=scratch, advantage_estimator="gae",
                                    critic_warmup_steps=0, kl_coef=0.0, adaptive_kl=False, progress=False)
        trainer = RLTrainer(run_config)
        batches = [_rollout_targets(run_config, trainer._sample_and_score, trainer._token_rewards,
                                    trainer.tokenizer.pad_token_id) for _ in range(settings.rounds)]
        history = _fit(run_config, trainer.value_model, batches, settings.epochs)
        critic = trainer.models.value_module
        info = {"settings": dataclasses.asdict(settings), "version": VALUE_PRETRAIN_VERSION,
                "config": {name: getattr(config, name) for name in PRETRAIN_FIELDS},
                "warm_start": str(trainer.model_path), "epochs": history}
        save_atomically(critic, trainer.tokenizer, output_dir, extra={"critic_info.json": info})
    return output_dir


@torch.no_grad()
def _rollout_targets(config: PPOConfig, sample_and_score, token_rewards_of, pad_token_id: int) -> dict:
    """One rollout batch of the initial policy and its Monte-Carlo returns ``[B, T]``:
    `sample_and_score(n_prompts)` draws and scores it and ``token_rewards_of(batch, kl,
    mask, beta, kl_in_reward)`` turns its scores into per-token rewards, as in RL
    (`RLTrainer._sample_and_score`, `RLTrainer._token_rewards`)."""
    cfg = config
    batch = sample_and_score(cfg.rollout_batch_size // cfg.group_size)
    # One width for every batch (their statistics are pooled), the run's own under AlpacaFarm's fixed width.
    batch.rollout = rollout = pad_to_width(batch.rollout, cfg.response_length, pad_token_id)
    mask = rollout.response_mask.float()  # [B, T]
    zero_kl = torch.zeros_like(mask)  # the initial policy is its own reference
    token_rewards, gae_mask, _ = token_rewards_of(batch, zero_kl, mask, 0.0, False)  # [B, T]
    returns = compute_gae(token_rewards, torch.zeros_like(token_rewards), gae_mask, cfg.gamma, 1.0)[1]  # [B, T]
    return {"query_ids": rollout.query_ids, "query_mask": rollout.query_mask, "response_ids": rollout.response_ids,
            "response_mask": mask, "returns": returns}


def _fit(config: PPOConfig, critic, batches: list[dict], epochs: int) -> list[dict]:
    """Minibatch MSE of `critic` on the returns, `epochs` passes; the value error and explained
    variance of each epoch (measured on every batch before that epoch's updates)."""
    cfg = config
    optimizer = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad],
                                  lr=cfg.value_lr if cfg.value_lr is not None else cfg.lr,
                                  betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                                  weight_decay=cfg.weight_decay)
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
    history = []
    for epoch in range(epochs + 1):  # the last pass only measures
        with torch.no_grad():
            values = [response_values(critic, b["query_ids"], b["query_mask"], b["response_ids"], b["response_mask"])
                      for b in batches]
        masks, returns = [b["response_mask"] for b in batches], [b["returns"] for b in batches]
        errors = sum(float(((v - r).pow(2) * m).sum()) for v, r, m in zip(values, returns, masks))
        history.append({"epoch": epoch, "value_error": errors / sum(float(m.sum()) for m in masks),
                        "explained_variance": explained_variance(torch.cat(values), torch.cat(returns),
                                                                 torch.cat(masks))})
        if epoch == epochs:
            break
        critic.train()
        for b in batches:
            for rows in torch.arange(len(b["returns"])).chunk(cfg.num_minibatches):
                mask = b["response_mask"][rows]
                values = response_values(critic, b["query_ids"][rows], b["query_mask"][rows],
                                         b["response_ids"][rows], mask)  # [b, T]
                loss = ((values - b["returns"][rows]).pow(2) * mask).sum() / mask.sum().clamp(min=1)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(critic.parameters(), max_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        critic.eval()
    return history


def main(argv: list[str] | None = None) -> int:
    from ppo.cli import build_parser, config_from_args

    parser = build_parser()
    parser.prog = "python -m ppo.models.value_pretrain"
    parser.description = __doc__.split("\n\n")[0]
    parser.add_argument("--rounds", type=int, default=PretrainSettings.rounds, help="rollout batches to fit on")
    parser.add_argument("--epochs", type=int, default=PretrainSettings.epochs, help="passes over them")
    parser.add_argument("--pretrain-seed", type=int, default=PretrainSettings.seed, help="seed of the rollouts")
    parser.add_argument("--force", action="store_true", help="fit again even if cached")
    args = parser.parse_args(argv)
    config = config_from_args(args)
    settings = PretrainSettings(rounds=args.rounds, epochs=args.epochs, seed=args.pretrain_seed)
    path = pretrain_critic(config, settings, force=args.force)
    info = json.loads((path / "critic_info.json").read_text())
    for row in info["epochs"]:
        print(f"epoch {row['epoch']}: value_error {row['value_error']:.4f} "
              f"explained_variance {row['explained_variance']:.3f}")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
