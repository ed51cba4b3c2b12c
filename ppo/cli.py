"""``ppo-train``: one RL run from a preset, a YAML file and command-line overrides.

Precedence, lowest first: `PPOConfig` defaults < ``--preset`` (< its testbed scaling with
``--testbed``) < ``--config FILE.yaml`` < ``--FIELD VALUE`` flags and ``--set FIELD=VALUE``.
Every config field is a flag, and ``--help`` prints each with its help string: the list of
implementation details this run can toggle.

Examples::

    ppo-train --preset alpacafarm --testbed --seed 1 --output-dir runs/af_s1
    ppo-train --preset grpo --testbed --kl-coef 0 --output-dir runs/grpo_beta0
    WANDB_MODE=offline ppo-train --preset grpo --testbed --report-to tensorboard,wandb --output-dir runs/grpo_s1
    ppo-train --output-dir runs/af_s1 --resume
    ppo-train --output-dir runs/af_s1 --resume --total-steps 200 --lr 5e-6 --allow-change lr

A resume refuses a config that differs from the run's config.yaml in anything but the fields
of `ppo.config.RESUMABLE_FIELDS` unless each changed field is named with ``--allow-change``;
allowed changes are recorded in the run's ``resume_history.jsonl``. A field of
`RESUMABLE_FIELDS` that a resume does not repeat keeps the run's stored value (not the
preset's). Config files with a key set twice are refused. Errors of the run (bad config,
damaged run directory, non-finite rewards, another process writing the run, a tracker
of ``--report-to`` not installed or not configured) print one message, no traceback. Ctrl-C
prints one line: the newest complete checkpoint and the exact command that resumes the run.
A misspelled flag or ``--set`` field is refused with the closest name ("did you mean").
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import fields
from pathlib import Path

import yaml

from ppo.config import (PRESETS, RENAMED_FIELDS, RESUMABLE_FIELDS, PPOConfig, field_help, parse_override, preset,
                     upgrade_field_names)
from ppo.run.run_dir import read_config_file
from ppo.settings.suggest import SuggestingParser


def _yaml_value(text: str):
    return yaml.safe_load(text) if text.strip() else None


def build_parser() -> argparse.ArgumentParser:
    parser = SuggestingParser(
        prog="ppo-train", description=__doc__.split("\n\n")[0],
        usage="ppo-train [--preset NAME [--testbed]] [--config FILE] [--FIELD VALUE ...] [--output-dir DIR] "
              "[--resume | --restart]")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="start from a named preset")
    parser.add_argument("--testbed", action="store_true", help="scale the preset's batch sizes and steps for the CPU testbed")
    parser.add_argument("--config", help="YAML file of field: value overrides")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override any field")
    parser.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its latest "
                        "intact checkpoint (from step 0 when it has none)")
    parser.add_argument("--restart", action="store_true", help="delete the outputs of the run in --output-dir and "
                        "start it again from step 0")
    parser.add_argument("--allow-change", action="append", default=[], metavar="FIELD",
                        help="with --resume: accept (and record) a changed value of FIELD; repeatable")
    group = parser.add_argument_group("PPOConfig fields (unset flags keep the preset's value)")
    defaults = PPOConfig()
    for f in fields(PPOConfig):
        flag = "--" + f.name.replace("_", "-")
        text = f"{field_help()[f.name]} [default: {getattr(defaults, f.name)!r}]"
        group.add_argument(flag, dest=f.name, type=_yaml_value, default=None, metavar="V",
                           help=text.replace("%", "%%"))  # argparse formats help with %
    for old, new in RENAMED_FIELDS.items():
        group.add_argument("--" + old.replace("_", "-"), dest=old, type=_yaml_value, default=None, metavar="V",
                           help=f"deprecated: old name of --{new.replace('_', '-')}")
    return parser


def config_from_args(args: argparse.Namespace) -> PPOConfig:
    # Each source is upgraded to the current field names on its own, so an old name in one
    # source overrides the new name in a lower one instead of clashing with it.
    overrides = {}
    if args.config:
        overrides.update(upgrade_field_names(read_config_file(args.config)))
    flags = {name: getattr(args, name) for name in [f.name for f in fields(PPOConfig)] + list(RENAMED_FIELDS)}
    overrides.update(upgrade_field_names({name: value for name, value in flags.items() if value is not None}))
    for text in args.set:
        name, value = parse_override(text)
        overrides[name] = value
    saved = Path(overrides.get("output_dir", PPOConfig().output_dir)) / "config.yaml"
    if args.resume and not args.preset and not args.config:
        # Resume from the run's own config.yaml, with any explicit overrides on top.
        if not saved.exists():
            raise FileNotFoundError(f"{saved}: nothing to resume")
        return PPOConfig.from_dict({**stored_settings(saved), **overrides})
    if args.preset:
        config = preset(args.preset, testbed=args.testbed, **overrides)
    elif args.testbed:
        raise ValueError("--testbed scales a preset: pass --preset too")
    else:
        config = PPOConfig.from_dict(overrides)
    if args.resume and saved.is_file():
        # A field a resume may change keeps the run's value unless this command sets it: the
        # preset's default is not a request (save_every 1 must not silently become 0).
        stored = stored_settings(saved)
        kept = {name: stored[name] for name in RESUMABLE_FIELDS if name in stored and name not in overrides}
        config = config.replace(**kept) if kept else config
    return config


def stored_settings(saved: Path) -> dict:
    """A run's ``config.yaml`` as a mapping; refused when empty or when a key is set twice."""
    try:
        data = upgrade_field_names(read_config_file(saved))
        if not data:
            raise ValueError("empty: it holds no settings, and reading it as the defaults would resume another run")
        PPOConfig.from_dict(data)
    except ValueError as error:
        message = str(error)
        raise ValueError(message if message.startswith(str(saved)) else f"{saved}: {message}") from None
    return data


def _program() -> str:
    """How this command was started: ``ppo-train`` or ``python -m ppo.cli``."""
    return "ppo-train" if Path(sys.argv[0] if sys.argv else "").name == "ppo-train" else "python -m ppo.cli"


def interrupted_message(output_dir: str | Path) -> str:
    """The one line printed on Ctrl-C: the newest complete checkpoint and the command that resumes."""
    from ppo.run.run_dir import checkpoint_candidates

    output_dir = Path(output_dir)
    try:
        checkpoints = checkpoint_candidates(output_dir)
    except Exception:  # a damaged checkpoints folder: --resume names it
        checkpoints = []
    command = f"{_program()} --output-dir {shlex.quote(str(output_dir))} --resume"
    where = (f"last checkpoint {checkpoints[0]}" if checkpoints
             else "no checkpoint yet (save_every sets how often one is written), so a resume starts at step 0")
    return f"ppo-train: interrupted; {where}; resume with: {command}"


def main(argv: list[str] | None = None) -> int:
    from ppo.parallel.launcher_watch import watch_launcher

    watch_launcher()  # first: a launcher killed while this worker loads must still end it
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before the run started (reading the config, importing torch)
        if os.environ.get("PPO_TRACEBACK"):
            raise
        print("\nppo-train: interrupted before the run started; nothing was trained", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.resume and args.restart:
        parser.error("--resume continues a run, --restart deletes it: pass one")
    if args.allow_change and not args.resume:
        parser.error("--allow-change only applies with --resume")
    try:
        config = config_from_args(args)
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    from ppo.run.guards import NonFiniteError, RewardTypeError
    from ppo.run.run_dir import RunDirectoryError
    from ppo.run.trackers import TrackerError
    from ppo.trainer import RLTrainer

    try:
        trainer = RLTrainer(config)
        summary = trainer.train(resume=args.resume, restart=args.restart, allow_changes=args.allow_change)
    except KeyboardInterrupt:  # Ctrl-C: where the run can go on from, not a traceback
        if os.environ.get("PPO_TRACEBACK"):
            raise
        print(f"\n{interrupted_message(config.output_dir)}", file=sys.stderr)
        return 130
    # The run's own errors are messages for the user, not bugs: one line, no traceback.
    except (ValueError, FileNotFoundError, FileExistsError, NonFiniteError, RewardTypeError,
            RunDirectoryError, TrackerError, ImportError) as error:  # ImportError: an optional extra missing
        if os.environ.get("PPO_TRACEBACK"):
            raise
        print(f"ppo-train: error: {error}", file=sys.stderr)
        return 1
    from ppo.parallel.distributed import is_main_process, shutdown

    main_process = is_main_process()
    already_finished = getattr(trainer, "already_finished", False)
    del trainer  # its DDP wrappers hold the process group, which shutdown must be able to end
    shutdown()  # every rank leaves the process group together (no group: nothing to do)
    if not main_process:  # one report per run, not one per process
        return 0
    initial, final = summary.get("initial_eval") or {}, summary["final_eval"]
    if already_finished:
        print(f"run: {config.output_dir} finished at step {summary['steps']} before this resume: nothing to do, "
              f"nothing changed (its summary.json is below). To train it further, resume with --total-steps above "
              f"{summary['steps']} (recorded in resume_history.jsonl).")
    print(f"run: {config.output_dir}  steps: {summary['steps']}  samples: {summary['samples']}")
    if initial:
        print(f"held-out sampled accuracy: {initial['sampled_accuracy']:.3f} -> {final['sampled_accuracy']:.3f}  "
              f"greedy: {initial['greedy_accuracy']:.3f} -> {final['greedy_accuracy']:.3f}")
    print(json.dumps({k: round(v, 4) for k, v in final.items() if isinstance(v, float)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
