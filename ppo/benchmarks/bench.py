"""Step time against an honest compute floor.

The **floor** of a step is the matrix arithmetic it cannot avoid, run at the best matrix
throughput this machine reaches, both measured in the same run:

- FLOPs are counted by `torch.utils.flop_counter.FlopCounterMode` on the step's own batch
  with **real tokens only**: the rows are grouped by their real length (prompt + response,
  no padding) and each group runs as one unpadded batch; a prompt the batch repeats (GRPO's
  G samples per prompt) is counted once, since its positions need computing once; each
  row's last token is not run (no output a step uses depends on it), and the last layer
  runs its queries and MLP only where outputs are read (`sequence_flops`). The passes
  counted are the ones no loop can skip: generation (one forward pass over those tokens;
  a KV-cached sampler does exactly that arithmetic), the reference forward (when beta > 0), the old critic's
  forward (PPO with more than one optimizer step per batch: nothing else gives the old
  values), and forward + backward of policy and critic once per epoch. Old log-probs are
  not counted: the generation logits give them. Elementwise work (norms, activations,
  softmax, AdamW) is not counted either, so the floor is a lower bound.
- Throughput is the best GFLOP/s of plain ``torch.mm`` over the model's own linear-layer
  shapes at the step's token count and one large square product, timed right after the
  steps.

``step / floor`` therefore says how far the loop is from the hardware, plumbing and
elementwise work included. To split that distance, a few more steps run with every matrix
product timed inside them (`ProductTimer`): the products the step really runs, their time
and FLOPs (``products / floor`` is how far the products alone are from the floor; the rest
of the step is elementwise work and plumbing). A second table keeps the per-phase view:
each phase's time in the step next to the same model call timed alone on the same batch
(an optimizer step on a copy included), which shows the loop's own glue.

    python -m ppo.benchmarks bench [--steps 8] [--presets alpacafarm grpo] [--identical-work MODEL_DIR]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from collections import defaultdict

import torch
from torch.utils.flop_counter import (FlopCounterMode, addmm_flop, baddbmm_flop, bmm_flop, mm_flop,
                                     sdpa_backward_flop_count, sdpa_flop_count)

from ppo.speed import lean_forward
from ppo.config import preset
from ppo.algorithm.dynamic_sampling import select_rollout
from ppo.models.logprobs import response_logprobs, response_logprobs_and_values, response_values
from ppo.models.optimization import adamw_kernel

from ablations.tables import markdown_table

PRODUCT_STEPS = 3  # steps after the timed ones whose matrix products are read off the profiler
PHASES = ("generate", "score", "policy_forward", "reference_forward", "value_forward", "rewards", "advantages", "update")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ---- FLOPs on real tokens ----------------------------------------------------------------------
def real_sequences(rollout) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each row's (prompt, response) real tokens: no padding, the response up to and
    including its stop token."""
    return [(ids_q[mask_q.bool()], ids_r[mask_r.bool()]) for ids_q, mask_q, ids_r, mask_r
            in zip(rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask)]


def length_groups(sequences: list[tuple[torch.Tensor, int]]) -> tuple[list[torch.Tensor], list[int]]:
    """(ids, prompt length) pairs stacked into ``[n, length]`` tensors, one per distinct
    (length, prompt length), and each group's prompt length."""
    groups = defaultdict(list)
    for ids, prompt_length in sequences:
        groups[(len(ids), prompt_length)].append(ids)
    keys = sorted(groups)
    return [torch.stack(groups[key]) for key in keys], [prompt_length for _, prompt_length in keys]


def _count(fn) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops()


def model_flops(model, groups: list[torch.Tensor], backward: bool, keep_from: list[int] | None = None) -> int:
    """FLOPs of `model` over the unpadded groups, forward only or forward + backward.

    With `keep_from` (one column per group) and a model on the lean path, the pass is the
    one the training loop runs: outputs from that column on only, so the last layer runs
    only those rows' queries and MLP (`ppo.speed.lean_forward._last_rows`) and the head only
    those columns, its attention as the two matrix products it is. Other models are counted
    through their module call, every column (their fused CPU attention kernel is not
    counted: the counter has no formula for it)."""
    total = 0
    backbone = lean_forward.lean_backbone(model)
    for index, ids in enumerate(groups):
        mask = torch.ones_like(ids)
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)

        def run():
            if backbone is not None and keep_from is not None:
                hidden = lean_forward.hidden_states(backbone, ids, positions, mask, keep_from=keep_from[index])
                out = model.lm_head(hidden) if hasattr(model, "lm_head") else model.head(hidden)
            else:
                out = model(input_ids=ids, attention_mask=mask, position_ids=positions)
                out = out.logits if hasattr(out, "logits") else out
            if backward:
                out.float().sum().backward()

        if backward:
            total += _count(run)
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                total += _count(run)
    return total


def _counted(model, sequences: list[tuple[torch.Tensor, int]], backward: bool) -> int:
    """`model_flops` over (ids, prompt length) pairs; outputs are needed from the prompt's
    last position on (it predicts the first response token)."""
    groups, prompt_lengths = length_groups(sequences)
    return model_flops(model, groups, backward, keep_from=[length - 1 for length in prompt_lengths])


def sequence_flops(model, rollout, backward: bool) -> int:
    """FLOPs of `model` over the rollout's real tokens, each row without its last token (no
    output a step uses depends on it: nothing is sampled after it, and by causality no
    earlier output sees it), each *distinct* prompt counted once (a batch that repeats a
    prompt, GRPO's G samples, needs its positions once, which the sampler
    (`ppo.speed.lean_sampling._prefill`) and the scoring passes (`PPOConfig.share_prompt_prefix`)
    both exploit), and on the lean path the last layer's prompt rows only as keys and
    values. Counted as full sequences, minus every row's prompt, plus each distinct prompt
    once."""
    pairs = real_sequences(rollout)
    full = _counted(model, [(torch.cat(pair)[:-1], len(pair[0])) for pair in pairs], backward)
    distinct = {tuple(prompt.tolist()): prompt for prompt, _ in pairs}
    if len(distinct) == len(pairs):
        return full
    every_prompt = _counted(model, [(prompt, len(prompt)) for prompt, _ in pairs], backward)
    return full - every_prompt + _counted(model, [(prompt, len(prompt)) for prompt in distinct.values()], backward)


def _old_pass_rows(passes, rollout):
    """The rows the old-policy and old-critic passes run over: with `reuse_update_forward`
    (`passes` is the run's `ppo.models.forward_passes.ForwardPasses`), all but the update's
    first micro-batch (whose own forward gives them; any rows of that count stand for it here)."""
    if not passes.reuses_update_forward:
        return rollout
    return select_rollout(rollout, torch.arange(passes.micro_batch_size(len(rollout)), len(rollout)))


def floor_flops(config, models, passes, rollout) -> dict[str, int]:
    """FLOPs of the passes one step of `config` cannot avoid, on `rollout`; `models` are the
    run's (`ppo.models.setup.Models`), `passes` its forward passes."""
    cfg = config
    policy = models.policy_module
    critic = models.value_module
    # Generation runs every real token but the last once (the same count as a scoring pass).
    policy_forward = sequence_flops(policy, rollout, backward=False)
    flops = {"generate": policy_forward}
    if models.ref_policy is not None:
        flops["reference_forward"] = policy_forward  # the same architecture and tokens
    optimizer_steps = cfg.ppo_epochs * cfg.num_minibatches
    if critic is not None and optimizer_steps > 1:  # the old values: the first micro-batch's come from its update pass
        flops["value_forward"] = sequence_flops(critic, _old_pass_rows(passes, rollout), backward=False)
    update = cfg.ppo_epochs * sequence_flops(policy, rollout, backward=True)
    if critic is not None:
        update += cfg.ppo_epochs * sequence_flops(critic, rollout, backward=True)
    flops["update"] = update
    return flops


def matmul_throughput(policy, tokens: int, repeats: int = 20) -> float:
    """Best FLOP/s of ``torch.mm`` over the policy's linear-layer shapes at `tokens` rows and
    a 1024^3 product (so small shapes that run badly do not lower the bar)."""
    shapes = {(1024, 1024, 1024)}
    for module in policy.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2 and not isinstance(module, torch.nn.Embedding):
            shapes.add((tokens, weight.shape[1], weight.shape[0]))
            shapes.add((tokens, weight.shape[0], weight.shape[1]))
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            torch.mm(a, b)
        count = repeats if m * k * n < 1e8 else 3
        start = time.perf_counter()
        for _ in range(count):
            torch.mm(a, b)
        seconds = (time.perf_counter() - start) / count
        best = max(best, 2 * m * k * n / seconds)
    return best


# ---- the matrix products a step really runs ----------------------------------------------------
# torch's own formulas (those `FlopCounterMode` counts the floor with), by the kernel's input shapes
_FORMULAS = {"aten::mm": (mm_flop, 2), "aten::addmm": (addmm_flop, 3), "aten::bmm": (bmm_flop, 2),
             "aten::baddbmm": (baddbmm_flop, 3),
             # the fused CPU attention kernel as its products: (query, key, value, ...)
             "aten::_scaled_dot_product_flash_attention_for_cpu": (sdpa_flop_count, 3),
             # (grad_out, query, key, value, ...)
             "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (sdpa_backward_flop_count, 4)}


def _product_flops(name: str, shapes: list) -> int | None:
    """FLOPs of one matrix-product kernel (or of the fused CPU attention kernel, counted as
    its products), forward or backward, from its input shapes; None for any other operator."""
    if name not in _FORMULAS:
        return None
    formula, inputs = _FORMULAS[name]
    return formula(*shapes[:inputs])


class ProductTimer:
    """The matrix products run inside it on the CPU: their time (`seconds`), FLOPs and calls.

    Every linear layer, attention's two products on the lean path and their backward passes
    end in ``mm``, ``addmm``, ``bmm`` or ``baddbmm`` kernels (2 m n k FLOPs each); the fused
    attention kernel (the sampler's one-token steps, a module call's attention) counts as its
    products, as the floor counts attention. Read off torch's profiler (each kernel's own
    time, its input shapes recorded), which adds little to a step: whole steps took 119.0 /
    119.5 ms (identical PPO work) and 1.557 / 1.374 s (AlpacaFarm) profiled / not, where
    timing each kernel from a Python dispatch mode made the PPO steps 168 ms and their
    products 16% longer.

    >>> with ProductTimer() as timer:
    ...     _ = torch.ones(4, 3) @ torch.ones(3, 5)
    >>> timer.flops, timer.calls
    (120, 1)
    """

    def __enter__(self):
        self.seconds, self.flops, self.calls = 0.0, 0, 0
        self._profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc):
        self._profile.__exit__(*exc)
        for event in self._profile.events():
            flops = _product_flops(event.name, event.input_shapes)
            if flops is not None:
                self.seconds += event.self_cpu_time_total / 1e6
                self.flops += flops
                self.calls += 1
        return False


def step_products(train_step, steps: int) -> dict[str, float]:
    """The matrix products of `steps` more calls of `train_step` (median per step): their time
    (``seconds``), FLOPs and calls. Where these exceed the floor's FLOPs the step runs work
    the floor leaves out (padding of sampling rows, the old policy's pass with several epochs);
    where their time exceeds the floor the products run below the best shape's rate."""
    per_step = []
    for _ in range(steps):
        with ProductTimer() as timer:
            train_step()
        per_step.append(timer)
    return {"seconds": statistics.median(t.seconds for t in per_step),
            "flops": statistics.median(t.flops for t in per_step),
            "calls": statistics.median(t.calls for t in per_step)}


# ---- model calls alone (the second table) --------------------------------------------------------
def calls_alone(config, models, passes, rollout) -> dict[str, float]:
    """Each model call of one step of `config` timed alone on the step's own batch (seconds);
    `models` are the run's (`ppo.models.setup.Models`), `passes` its forward passes."""
    cfg = config
    policy = models.policy_module
    from ppo.models.rollout import generate

    times = {}
    prompts = models.tokenizer.batch_decode(rollout.query_ids, skip_special_tokens=True)
    times["generate"] = _timed(lambda: generate(policy, models.tokenizer, prompts, cfg.response_length,
                                                temperature=cfg.temperature, stop_token_ids=models.stop_token_ids))
    args = (rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask)
    old = _old_pass_rows(passes, rollout)
    old_args = (old.query_ids, old.query_mask, old.response_ids, old.response_mask)
    with torch.no_grad():
        if len(old):
            times["policy_forward"] = _timed(lambda: response_logprobs(policy, *old_args))
        if models.ref_policy is not None:
            times["reference_forward"] = _timed(lambda: response_logprobs(models.ref_policy, *args))
        if models.value_model is not None and len(old):
            times["value_forward"] = _timed(lambda: response_values(models.value_model, *old_args))
    # The update on copies: forward + backward per micro-batch, an AdamW step per minibatch.
    # one deepcopy of both, so a paired policy's copy is paired with the critic's (PPOConfig.paired_critic_pass);
    # copying stores each parameter on its own, so the copies are paired again to share one storage, as `pair` keeps them
    policy_copy, critic_copy = copy.deepcopy((policy, models.value_model))
    if critic_copy is not None and lean_forward.paired_critic(policy_copy, critic_copy):
        lean_forward.pair(policy_copy, critic_copy)
    params = list(policy_copy.parameters()) + (list(critic_copy.parameters()) if critic_copy is not None else [])
    optimizer = torch.optim.AdamW(params, lr=1e-12, **adamw_kernel([policy_copy, critic_copy]))  # the trainer's kernel
    micro = max(1, passes.micro_batch_size(len(rollout)))

    def update():
        for _ in range(cfg.ppo_epochs * cfg.num_minibatches):
            for start in range(0, len(rollout) // cfg.num_minibatches, micro):
                chunk = tuple(a[start:start + micro] for a in args)
                if critic_copy is not None:  # as the step's update pass: one pass of both when paired
                    outputs = response_logprobs_and_values(policy_copy, critic_copy, *chunk)
                    loss = outputs["logprobs"].mean() + outputs["values"].mean()
                else:
                    loss = response_logprobs(policy_copy, *chunk, with_entropy=True)[0].mean()
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    times["update"] = _timed(update)
    return times


# ---- one configuration -----------------------------------------------------------------------
def bench_config(name: str, config, task=None, steps: int = 8, warmup: int = 2,
                 product_steps: int = PRODUCT_STEPS) -> dict:
    from ppo.trainer import RLTrainer

    trainer = RLTrainer(config, task=task)
    captured = {}
    sample_and_score = trainer._sample_and_score

    def capture(*args, **kwargs):  # keep the step's own batch for the floor and the calls alone
        batch = sample_and_score(*args, **kwargs)
        captured["rollout"] = batch.rollout
        return batch

    trainer._sample_and_score = capture
    step_times, phase_times, flops, alone = [], defaultdict(list), defaultdict(list), defaultdict(list)
    for i in range(warmup + steps):
        metrics = trainer.train_step()
        if i < warmup:
            continue
        step_times.append(metrics["time_step"])
        for phase in PHASES:
            phase_times[phase].append(metrics.get(f"time_{phase}", 0.0))
        for key, value in floor_flops(trainer.config, trainer.models, trainer.passes, captured["rollout"]).items():
            flops[key].append(value)
        for key, value in calls_alone(trainer.config, trainer.models, trainer.passes, captured["rollout"]).items():
            alone[key].append(value)
    # a few more steps with their products read off the profiler (CPU kernels: elsewhere a
    # kernel's own time on the host is not its time on the device)
    products = step_products(trainer.train_step, product_steps) if trainer.device.type == "cpu" else None
    tokens = int(captured["rollout"].query_mask.sum() + captured["rollout"].response_mask.sum())
    throughput = matmul_throughput(trainer.policy_module, tokens)
    flops_median = {k: statistics.median(v) for k, v in flops.items()}
    floor = sum(flops_median.values()) / throughput
    step = statistics.median(step_times)
    return {
        "name": name, "step": step, "floor": floor, "ratio": step / floor, "throughput": throughput,
        "flops": flops_median, "phases": {p: statistics.median(v) for p, v in phase_times.items()},
        "alone": {k: statistics.median(v) for k, v in alone.items()}, "products": products,
    }


def bench_preset(name: str, steps: int, warmup: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        config = preset(name, testbed=True, output_dir=tmp, progress=False, eval_every=0, save_every=0)
        return bench_config(name, config, steps=steps, warmup=warmup)


def bench_identical_work(kind: str, model_path: str, steps: int, warmup: int = 4) -> dict:
    from .speed_runs import config_for
    from .speed_task import AdditionTask

    with tempfile.TemporaryDirectory() as tmp:
        config = config_for(kind, model_path, 42, warmup + steps + PRODUCT_STEPS, tmp)  # every step it runs
        return bench_config(f"identical work: {kind}", config, task=AdditionTask(), steps=steps, warmup=warmup)


def _product_cells(result: dict) -> list[str]:
    products = result.get("products")
    if not products:  # not measured (a GPU run)
        return ["-"] * 4
    return [f"{products['seconds']:.4f}", f"{products['flops'] / 1e9:.2f}",
            f"{products['flops'] / products['seconds'] / 1e9:.0f}", f"{products['seconds'] / result['floor']:.1f}"]


def format_bench(results: list[dict]) -> str:
    totals = markdown_table(
        ["setting", "step (s)", "floor (s)", "step / floor", "GFLOP per step", "matmul GFLOP/s",
         "products in the step (s)", "their GFLOP", "their GFLOP/s", "products / floor"],
        [[r["name"], f"{r['step']:.4f}", f"{r['floor']:.4f}", f"{r['ratio']:.1f}",
          f"{sum(r['flops'].values()) / 1e9:.2f}", f"{r['throughput'] / 1e9:.0f}", *_product_cells(r)]
         for r in results])
    phases = []
    for r in results:
        for phase in PHASES:
            in_step, alone, flops = r["phases"].get(phase, 0.0), r["alone"].get(phase), r["flops"].get(phase)
            if in_step == 0.0 and alone is None and flops is None:
                continue
            phases.append([r["name"], phase, f"{in_step:.4f}", "-" if alone is None else f"{alone:.4f}",
                           "-" if flops is None else f"{flops / 1e9:.3f}"])
    return totals + "\n\n" + markdown_table(
        ["setting", "phase", "in the step (s)", "call alone (s)", "floor FLOPs (GFLOP)"], phases)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ppo.benchmarks bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per setting (after warm-up steps)")
    parser.add_argument("--presets", nargs="*", default=["alpacafarm", "grpo"], help="testbed presets")
    parser.add_argument("--identical-work", metavar="MODEL_DIR", default=None,
                        help="also the GRPO and PPO work of `python -m ppo.benchmarks speed`, from this model")
    args = parser.parse_args(argv)
    results = [bench_preset(name, args.steps) for name in args.presets]
    if args.identical_work:
        results += [bench_identical_work(kind, args.identical_work, args.steps) for kind in ("grpo", "ppo")]
    print(format_bench(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
