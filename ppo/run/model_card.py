"""The model card of a saved policy: ``README.md`` in every checkpoint's ``policy/`` folder.

A checkpoint found later, copied away from its run directory, should say what it is: the
model it started from, the preset it is closest to and every setting that differs from that
preset (those the configuration never read listed apart, with the reason), how many steps it trained, its latest held-out evaluation (named final when it is
the last step's), and the run's provenance (`ppo.run.provenance`). `write` is called once per
checkpoint (`ppo.run.checkpoints.save`).

The preset is the one whose config (as is, or scaled for the testbed) differs from the run's
in the fewest fields: a config does not record which preset it came from, and a user's YAML
file may start from any of them.
"""

from __future__ import annotations

import json
from pathlib import Path

from ppo.config import PRESETS, PPOConfig, preset
from ppo.settings.config_checks import inert_settings
from ppo.run.provenance import collect


def nearest_preset(config: PPOConfig) -> tuple[str | None, bool, dict]:
    """(name, testbed, {field: (preset's value, run's value)}) of the preset closest to
    `config`; name None stands for the `PPOConfig` defaults (no preset), which win ties."""
    values = config.to_dict()
    best = None
    candidates = [(None, False)] + [(name, testbed) for name in PRESETS for testbed in (False, True)]
    for name, testbed in candidates:
        try:
            reference = (PPOConfig() if name is None else preset(name, testbed=testbed)).to_dict()
        except ValueError:
            continue
        diff = {key: (reference[key], value) for key, value in values.items() if reference[key] != value}
        if best is None or len(diff) < len(best[2]):
            best = (name, testbed, diff)
    return best


def _cell(value) -> str:
    return f"`{json.dumps(value)}`".replace("|", "\\|")


def render(config: PPOConfig, step: int, base_model: str | None, latest_eval: tuple[int, dict] | None,
           provenance_record: dict) -> str:
    """The model card's markdown."""
    name, testbed, diff = nearest_preset(config)
    label = ("the PPOConfig defaults (no preset)" if name is None
             else f"the preset `{name}`" + (" scaled for the testbed (--testbed)" if testbed else ""))
    library = "peft" if config.lora_r else "transformers"
    lines = ["---", f"library_name: {library}", "tags:", "- ppo-details", "- reinforcement-learning",
             f"- {config.advantage_estimator}", "---", "",
             f"# Policy after {step} of {config.total_steps} RL steps ({config.advantage_estimator})", "",
             "Saved by `ppo-train`; the folder loads with transformers' `from_pretrained`"
             + (" (a LoRA adapter: peft)." if config.lora_r else "."), "",
             "| | |", "|---|---|",
             f"| base model | `{base_model or 'a policy passed in as an object'}` |",
             f"| warm start digest | `{provenance_record.get('warm_start', 'unknown')}` |",
             f"| task | `{config.task}` |",
             f"| steps | {step} of {config.total_steps} |",
             f"| preset | {label}, the nearest to this run's config |", "",
             f"## Settings that differ from {label}", ""]
    # A setting the configuration never read did not shape this policy: it is listed apart,
    # with the reason, rather than among the settings that differ.
    inert = dict(inert_settings(config))
    acted = {key: change for key, change in diff.items() if key not in inert}
    if acted:
        lines += ["| field | preset | this run |", "|---|---|---|"]
        lines += [f"| `{key}` | {_cell(old)} | {_cell(new)} |" for key, (old, new) in acted.items()]
    else:
        lines.append("None: the run used these settings as they are.")
    lines += [""]
    if inert:
        lines += ["## Settings with no effect in this run", "", "| field | value | why |", "|---|---|---|"]
        lines += [f"| `{key}` | {_cell(getattr(config, key))} | {why.split(': ', 1)[-1]} |"
                  for key, why in inert.items()]
        lines += [""]
    if latest_eval is not None:
        eval_step, metrics = latest_eval
        which = "final" if eval_step == config.total_steps else "latest"
        lines += [f"## Held-out evaluation ({which}, after step {eval_step})", "", "| metric | value |", "|---|---|"]
        lines += [f"| {key} | {value:.4f} |" if isinstance(value, float) else f"| {key} | {value} |"
                  for key, value in metrics.items()]
        lines += [""]
    lines += ["## Provenance", "", "| | |", "|---|---|"]
    lines += [f"| {key} | `{value}` |" for key, value in provenance_record.items()]
    return "\n".join(lines) + "\n"


def write(folder: Path, config: PPOConfig, step: int, base_model: str | None,
          latest_eval: tuple[int, dict] | None) -> Path:
    """Write ``folder/README.md`` for the policy of the run `config` after `step` steps, started
    from `base_model` (None: passed in as an object), with its latest held-out evaluation
    ``(step, metrics)`` if any (main process)."""
    from ppo.parallel import distributed

    record = collect(base_model, config.threads, distributed.world_size(), config.reward_model_path)
    path = Path(folder) / "README.md"
    path.write_text(render(config, step, base_model, latest_eval, record), encoding="utf-8")
    return path
