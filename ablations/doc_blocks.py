"""Generated blocks of a markdown file: the text between ``<!-- generated:NAME -->`` and
``<!-- /generated:NAME -->``, which a command rewrites from data (`ablations.claims`) and a
test regenerates to check the page says nothing else."""

from __future__ import annotations

import json
import re
from pathlib import Path


def block_names(text: str) -> list[str]:
    """The names of every generated block in `text`, in order."""
    return re.findall(r"<!-- generated:([\w:./-]+) -->", text)


def generated_block(text: str, name: str) -> str:
    """The text between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``, stripped."""
    tag = re.escape(name)
    match = re.search(rf"<!-- generated:{tag} -->\n(.*?)<!-- /generated:{tag} -->", text, re.S)
    if match is None:
        raise ValueError(f"no <!-- generated:{name} --> ... <!-- /generated:{name} --> block")
    return match.group(1).strip()


def replace_block(text: str, name: str, content: str) -> str:
    """`text` with the block `name` (see `generated_block`) holding `content`."""
    generated_block(text, name)  # raises if the markers are missing
    tag = re.escape(name)
    return re.sub(rf"(<!-- generated:{tag} -->\n).*?(<!-- /generated:{tag} -->)",
                  lambda m: m.group(1) + content.strip() + "\n" + m.group(2), text, flags=re.S)


def instrument_table(kind: str, path: Path) -> str:
    """The noise budget (`ablations.noise`) or A/A check (`ablations.aa`) saved in `path`, as markdown."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file (written by python -m ablations {kind} ... --json {path})")
    data = json.loads(path.read_text())
    if kind == "noise":
        from .noise import markdown

        return markdown(data["table"], data["seeds"], data["target"], data.get("cost"))
    from .aa import markdown

    return markdown(data["result"])
