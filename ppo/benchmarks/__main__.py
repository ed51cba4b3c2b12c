"""``python -m ppo.benchmarks``: the speed and memory benchmarks.

Commands (each takes ``--help``)::

    python -m ppo.benchmarks bench [--steps 8] [--presets alpacafarm grpo] [--identical-work MODEL_DIR]
    python -m ppo.benchmarks speed model|run|compare|pool ...
    python -m ppo.benchmarks memory [--hidden 512 --layers 8] [--steps 2] [--lora-r 8]
"""

from __future__ import annotations

import importlib
import sys

# Each command is the module of that name; everything after the name goes to its main().
COMMANDS = {"bench": "step time against the FLOP floor, phase by phase",
            "speed": "seconds per step side by side with TRL on a fixed tiny task",
            "memory": "LoRA against full fine-tuning: peak memory and training-state bytes"}
USAGE_ERROR = 2  # a bad command line, as argparse exits


def usage() -> str:
    """The commands and what each measures."""
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    return "usage: python -m ppo.benchmarks {" + ",".join(COMMANDS) + "} ...\n\ncommands:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else USAGE_ERROR
    if argv[0] not in COMMANDS:
        print(f"{usage()}\n\npython -m ppo.benchmarks: unknown command {argv[0]!r}", file=sys.stderr)
        return USAGE_ERROR
    module = importlib.import_module(f"ppo.benchmarks.{argv[0]}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
