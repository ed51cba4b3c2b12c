"""The KL gradient study: which (estimator x placement) pair follows the gradient of KL(pi || ref).

``python -m ablations.kl_gradient_study [--batches 400] [--groups 20] [--prompts 32] [--update docs/derivations.md]``

(about half a minute on one CPU thread).

For one fixed policy pi (the pinned warm start) and reference (its pinned step-200
checkpoint), at a fixed set of states (prompts and the prefixes of responses sampled once),
it compares each pair's gradient with the exact gradient of the per-state KL,
``grad sum_s KL(pi(.|s) || ref(.|s))`` (from `ppo.algorithm.kl.full_kl`, no sampling at all):

- **expected**: the pair's exact expected gradient, every token of the vocabulary at every
  state weighted by the sampler's probability (no Monte-Carlo noise: the bias alone);
- **Monte-Carlo**: the mean over `batches` sampled batches (one token per state each), with
  95% jackknife intervals over `groups` groups of batches: what a run would average to.

Each is reported as the cosine with the exact gradient, the relative error
``|g - g_exact| / |g_exact|`` and (expected only) the norm ratio ``|g| / |g_exact|`` of the
policy's parameter gradient (float64 on the flat vector).

On-policy the tokens come from pi; off-policy from a lagging sampler pi_old (weights 5% of
the way from pi back to the reference), as the later minibatches of
``ppo_epochs > 1`` see them. The pairs:

- ``k1|reward``, ``k3|reward``: the estimate at rollout time (old log-probs) as a reward
  on the token, through the PPO ratio: loss ``sg(k(old)) * pi / sg(pi_old)`` (no clipping);
- ``k1|loss``, ``k2|loss``, ``k3|loss``, ``k1+|loss``, ``k3+|loss``: `ppo.algorithm.kl.kl_penalty` of
  the current log-probs as a loss term (as `ppo.algorithm.losses.kl_loss` adds it);
- ``k3·IS|loss``: k3 times ``pi / sg(pi_old)`` (`ppo.algorithm.kl.importance_weighted_kl`, TRL).

What the fixed states leave out: an action also changes which states follow. A KL in the
reward carries that through the return (its gradient is the gradient of the *sequence*
KL), a KL in the loss does not; here the reward pairs get the token's own KL as its reward,
which isolates the per-state term every placement shares.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import torch

from ppo.algorithm.kl import full_kl, importance_weighted_kl, kl_penalty

PAIRS = ("k1|reward", "k3|reward", "k1|loss", "k2|loss", "k3|loss", "k1+|loss", "k3+|loss", "k3·IS|loss")
TABLE_BEGIN = "<!-- kl-gradient-study:begin (generated: python -m ablations.kl_gradient_study --update FILE) -->"
TABLE_END = "<!-- kl-gradient-study:end -->"


def per_token_objective(pair: str, logp: torch.Tensor, ref: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """The per-token term whose gradient a pair follows, for log-probs of sampled tokens
    (`logp` with autograd; `ref`, `old` without)."""
    estimator, placement = pair.split("|")
    ratio = torch.exp(logp - old)  # pi / sg(pi_old): 1 in value on-policy
    if placement == "reward":
        return kl_penalty(old, ref, estimator).detach() * ratio
    if estimator == "k3·IS":
        return importance_weighted_kl(kl_penalty(logp, ref, "k3"), logp, old)
    return kl_penalty(logp, ref, estimator)


def expected_logit_gradient(pair: str, logits: torch.Tensor, ref_log_probs: torch.Tensor,
                            sampler_log_probs: torch.Tensor) -> torch.Tensor:
    """The exact expectation over sampled tokens of the pair's gradient w.r.t. the policy's
    logits ``[S, V]``: every token at every state, weighted by the sampler's probability."""
    leaf = logits.detach().requires_grad_(True)
    log_probs = torch.log_softmax(leaf, -1)  # [S, V]: each column is one possible sampled token
    per_token = per_token_objective(pair, log_probs, ref_log_probs, sampler_log_probs)  # [S, V]
    objective = (sampler_log_probs.exp() * per_token).sum() / len(logits)
    (grad,) = torch.autograd.grad(objective, leaf)
    return grad  # [S, V]


def sampled_logit_gradients(pair: str, logits: torch.Tensor, ref_log_probs: torch.Tensor,
                            sampler_log_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Sum over batches of the pair's gradient w.r.t. the logits, one sum per group:
    `tokens` ``[G, n, S]`` (one sampled token per state per batch) -> ``[G, S, V]``."""
    groups, per_group, states = tokens.shape
    leaf = logits.detach().expand(groups, *logits.shape).clone().requires_grad_(True)  # [G, S, V]
    log_probs = torch.log_softmax(leaf, -1)[:, None].expand(groups, per_group, *logits.shape)  # [G, n, S, V]

    def pick(table):  # [.., S, V] -> [G, n, S] at the sampled tokens
        return table.expand(groups, per_group, *logits.shape).gather(-1, tokens[..., None])[..., 0]

    per_token = per_token_objective(pair, pick(log_probs), pick(ref_log_probs), pick(sampler_log_probs))
    (grad,) = torch.autograd.grad(per_token.sum() / states, leaf)
    return grad  # [G, S, V]


def parameter_gradient(logits: torch.Tensor, params: list, logit_grad: torch.Tensor) -> torch.Tensor:
    """Chain a logit gradient ``[S, V]`` through the policy: the flat parameter gradient."""
    grads = torch.autograd.grad(logits, params, grad_outputs=logit_grad, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])


def compare(gradient: torch.Tensor, exact: torch.Tensor) -> tuple[float, float, float]:
    """(cosine, relative error, norm ratio) of a flat gradient against the exact one."""
    gradient, exact = gradient.double(), exact.double()  # float32 cosines of long vectors pass 1
    cosine = (gradient @ exact / (gradient.norm() * exact.norm()).clamp(min=1e-300)).item()
    return cosine, ((gradient - exact).norm() / exact.norm()).item(), (gradient.norm() / exact.norm()).item()


def jackknife(group_sums: torch.Tensor, exact: torch.Tensor, per_group: int) -> dict[str, tuple[float, float]]:
    """Each statistic of the mean over all groups, with its 95% jackknife half-width over
    the leave-one-group-out means: `group_sums` ``[G, P]`` parameter gradients summed per group."""
    groups = len(group_sums)
    total = group_sums.sum(0)
    full = compare(total / (groups * per_group), exact)
    leave_one_out = [compare((total - g) / ((groups - 1) * per_group), exact) for g in group_sums]
    out = {}
    for k, name in enumerate(("cosine", "rel_error")):
        values = torch.tensor([row[k] for row in leave_one_out], dtype=torch.float64)
        se = math.sqrt((groups - 1) / groups * float(((values - values.mean()) ** 2).sum()))
        out[name] = (full[k], 1.96 * se)
    return out


def load_models(lag: float):
    """(tokenizer, pi, ref, pi_old): the pinned warm start, its step-200 checkpoint, and a
    sampler a fraction `lag` of the way from pi back to ref (weights interpolated)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ppo.models.sft import warm_start

    policy_dir, reference_dir = warm_start(progress=False), warm_start(progress=False, stop_after=200)
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    models = [AutoModelForCausalLM.from_pretrained(d).eval() for d in (policy_dir, reference_dir, policy_dir)]
    policy, reference, sampler = models
    with torch.no_grad():
        for p_old, p, r in zip(sampler.parameters(), policy.parameters(), reference.parameters()):
            p_old.copy_(p + lag * (r - p))
    return tokenizer, policy, reference, sampler


def state_log_probs(model, rollout, grad: bool = False):
    """The model's logits ``[S, V]`` at every real response position of `rollout`."""
    from ppo.models.forward_passes import response_log_softmax, rollout_args

    with torch.set_grad_enabled(grad):
        args = rollout_args(rollout)
        # log-softmax is shift-invariant: its values serve as logits for the gradient chain
        log_probs = response_log_softmax(model, *args)  # [B, T, V]
    return log_probs[rollout.response_mask.bool()]  # [S, V]


def run_study(batches: int = 400, groups: int = 20, prompts: int = 32, response_length: int = 8,
              lag: float = 0.05, seed: int = 0) -> dict:
    """Rows ``{setting: {pair: {"expected": (cos, err), "cosine": (mean, ±), "rel_error": (mean, ±)}}}``
    and the setting's KL, on-policy and off-policy."""
    import random

    from ppo.models.rollout import generate
    from ppo.models.sft import SFTConfig

    torch.manual_seed(seed)
    tokenizer, policy, reference, sampler = load_models(lag)
    params = [p for p in policy.parameters() if p.requires_grad]
    problems = SFTConfig().task().sample_problems(prompts, random.Random(seed))
    results = {}
    for setting, behaviour in (("on-policy", policy), ("off-policy", sampler)):
        with torch.no_grad():  # the states: prefixes of responses the sampler drew once
            rollout = generate(behaviour, tokenizer, [p.prompt for p in problems], response_length)
        logits = state_log_probs(policy, rollout, grad=True)  # [S, V], autograd to the parameters
        ref_log_probs = state_log_probs(reference, rollout)  # [S, V]
        sampler_log_probs = state_log_probs(behaviour, rollout)  # [S, V]
        leaf = logits.detach().requires_grad_(True)
        kl = full_kl(torch.log_softmax(leaf, -1), ref_log_probs)  # [S]
        (exact_logit,) = torch.autograd.grad(kl.mean(), leaf)
        exact = parameter_gradient(logits, params, exact_logit)
        per_group = batches // groups
        tokens = torch.distributions.Categorical(logits=sampler_log_probs).sample((groups, per_group))  # [G, n, S]
        rows = {}
        for pair in PAIRS:
            expected = parameter_gradient(logits, params, expected_logit_gradient(
                pair, logits, ref_log_probs, sampler_log_probs))
            sums = sampled_logit_gradients(pair, logits, ref_log_probs, sampler_log_probs, tokens)  # [G, S, V]
            group_sums = torch.stack([parameter_gradient(logits, params, s) for s in sums])  # [G, P]
            rows[pair] = {"expected": compare(expected, exact), **jackknife(group_sums, exact, per_group)}
        results["provenance"] = (f"pi = warm start {Path(policy.name_or_path).name}, ref = {Path(reference.name_or_path).name}, "
                                 f"{len(problems)} prompts x {response_length} tokens, seed {seed}, "
                                 f"{torch.get_num_threads()} thread(s), torch {torch.__version__}")
        results[setting] = {"pairs": rows, "states": len(logits), "kl_per_token": kl.mean().item(),
                            "sampler_kl_to_policy": full_kl(sampler_log_probs, logits.detach()).mean().item()}
    return results


def markdown_table(results: dict, batches: int, groups: int) -> str:
    lines = [results["provenance"], ""]
    for setting, block in results.items():
        if setting == "provenance":
            continue
        lines.append(f"**{setting}** ({block['states']} states; exact KL(pi‖ref) per token "
                     f"{block['kl_per_token']:.4f}; KL(pi_old‖pi) per token {block['sampler_kl_to_policy']:.4f})")
        lines.append("")
        lines.append("| pair | expected: cosine | expected: rel. error | expected: norm ratio | MC mean of "
                     f"{batches} batches: cosine (95% jackknife, {groups} groups) | MC: rel. error |")
        lines.append("|---|---|---|---|---|---|")
        for pair, row in block["pairs"].items():
            cos, err, norm = row["expected"]
            mc_cos, mc_err = row["cosine"], row["rel_error"]
            estimator, placement = pair.split("|")
            lines.append(f"| `{estimator}` in the {placement} | {cos:+.4f} | {err:.4f} | {norm:.4f} | {mc_cos[0]:+.4f} ± {mc_cos[1]:.4f} "
                         f"| {mc_err[0]:.4f} ± {mc_err[1]:.4f} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def update_doc(path: Path, table: str) -> None:
    """Replace the text between the study's markers in `path` with `table`."""
    text = path.read_text()
    pattern = re.compile(re.escape(TABLE_BEGIN) + ".*?" + re.escape(TABLE_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no kl-gradient-study markers")
    path.write_text(pattern.sub(lambda _: f"{TABLE_BEGIN}\n{table}{TABLE_END}", text))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ablations.kl_gradient_study", description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=400, help="sampled batches per pair (one token per state each)")
    parser.add_argument("--groups", type=int, default=20, help="groups of batches for the jackknife intervals")
    parser.add_argument("--prompts", type=int, default=32, help="prompts whose response prefixes are the states")
    parser.add_argument("--response-length", type=int, default=8, help="response tokens sampled per prompt")
    parser.add_argument("--lag", type=float, default=0.05, help="off-policy sampler: this fraction of the way back to ref")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--update", type=Path, nargs="+", default=[], help="write the table between the markers of these files")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = run_study(args.batches, args.groups, args.prompts, args.response_length, args.lag, args.seed)
    table = markdown_table(results, args.batches, args.groups)
    print(table)
    for path in args.update:
        update_doc(path, table)


if __name__ == "__main__":
    main()
