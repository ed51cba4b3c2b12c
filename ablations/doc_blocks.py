"""Generated blocks of a markdown file: the text between ``<!-- generated:NAME -->`` and
``<!-- /generated:NAME -->``, which a command rewrites from data (`ablations.claims`) and a
test regenerates to check the page says nothing else."""

from __future__ import annotations

import re


def block_names(text: str) -> list[str]:
    """The names of every generated block in `text`, in order."""
    return re.findall(r"<!-- generated:([\w:.-]+) -->", text)


def generated_block(text: str, name: str) -> str:
    """The text between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``, stripped."""
    match = re.search(rf"<!-- generated:{name} -->\n(.*?)<!-- /generated:{name} -->", text, re.S)
    if match is None:
        raise ValueError(f"no <!-- generated:{name} --> ... <!-- /generated:{name} --> block")
    return match.group(1).strip()


def replace_block(text: str, name: str, content: str) -> str:
    """`text` with the block `name` (see `generated_block`) holding `content`."""
    generated_block(text, name)  # raises if the markers are missing
    return re.sub(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)",
                  lambda m: m.group(1) + content.strip() + "\n" + m.group(2), text, flags=re.S)
