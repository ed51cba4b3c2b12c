"""Suggestions for misspelled names: "did you mean" for config fields, flags and file keys.

`did_you_mean` is the one rule (difflib's closest matches, cutoff 0.6); `SuggestingParser`
is an `argparse.ArgumentParser` whose "unrecognized arguments" error names the closest flag
of the command, e.g. ``--kl-clip-at-zer0`` -> ``did you mean --kl-clip-at-zero?``.
"""

from __future__ import annotations

import argparse
import difflib
from typing import Iterable

# difflib's similarity ratio a suggestion must reach: 0.6 keeps one-letter slips and
# swapped words, and drops unrelated names.
CUTOFF = 0.6


def did_you_mean(name: str, choices: Iterable[str], count: int = 1) -> str:
    """``" (did you mean 'kl_coef'?)"`` for the closest of `choices`, or ``""`` when none is close.

    Worked example: ``did_you_mean("whiten_reward", ["whiten_rewards", "lr"])`` gives
    ``" (did you mean 'whiten_rewards'?)"``; ``did_you_mean("xyz", ["lr"])`` gives ``""``.
    """
    matches = difflib.get_close_matches(str(name), [str(c) for c in choices], n=count, cutoff=CUTOFF)
    if not matches:
        return ""
    return " (did you mean " + " or ".join(repr(m) for m in matches) + "?)"


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every long flag of `parser` and of its subcommands."""
    flags = []
    for action in parser._actions:
        flags += [s for s in action.option_strings if s.startswith("--")]
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags += _option_strings(sub)
    return list(dict.fromkeys(flags))


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser that follows "unrecognized arguments" with the closest known flags."""

    def error(self, message: str):
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            flags = _option_strings(self)
            hints = []
            for word in message[len(prefix):].split():
                if word.startswith("--"):
                    close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=CUTOFF)
                    if close:
                        hints.append(f"{word.split('=', 1)[0]}: did you mean {close[0]}?")
            if hints:
                message += "\n" + "\n".join(hints)
        super().error(message)
