"""docs/exercises.md runs: every exercise's code is executed and its printed output must match
the output block under it, character for character; every decimal number the prose quotes
must appear in that exercise's code or output. So the page cannot go stale: change a
function's numbers and this test names the exercise that now disagrees.

After a deliberate change, rewrite the output blocks with
``python tests/test_exercises.py --write`` and reread the prose around any number that moved.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

import pytest

EXERCISES = Path(__file__).resolve().parent.parent / "docs" / "exercises.md"

# A python block, then (after optional prose such as "Output:") the text block it prints.
_PAIR = re.compile(r"```python\n(?P<code>.*?)```\s*\n(?:[^`\n]*\n)*?```text\n(?P<output>.*?)```", re.S)
_BLOCK = re.compile(r"```.*?```", re.S)
_DECIMAL = re.compile(r"(?<![\w.])-?\d+\.\d+")


def exercise_sections(text: str) -> dict[str, str]:
    """'Exercise N: title' -> its markdown, for every level-2 heading starting with 'Exercise'."""
    parts = re.split(r"^## ", text, flags=re.M)
    return {part.split("\n", 1)[0].strip(): part for part in parts[1:] if part.startswith("Exercise")}


def run_code(code: str, namespace: dict) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, str(EXERCISES), "exec"), namespace)
    return buffer.getvalue()


def run_section(section: str) -> list[tuple[str, str, str]]:
    """`(code, printed, expected)` for each code/output pair, run in order in one namespace."""
    namespace: dict = {"__name__": "exercise"}
    return [(m["code"], run_code(m["code"], namespace), m["output"]) for m in _PAIR.finditer(section)]


SECTIONS = exercise_sections(EXERCISES.read_text())


def test_the_page_has_the_exercises():
    assert len(SECTIONS) >= 6, f"docs/exercises.md: expected at least 6 exercises, found {list(SECTIONS)}"
    for title, section in SECTIONS.items():
        assert _PAIR.search(section), f"{title}: no ```python block followed by its ```text output"


@pytest.mark.parametrize("title", sorted(SECTIONS))
def test_answers_are_folded_below_the_statement(title):
    """A student sees the statement first: the statement sits outside, and every code block,
    output and the explanation inside one <details> block that closes the section."""
    section = SECTIONS[title]
    opened, closed = section.find("<details>"), section.rfind("</details>")
    assert section.count("<details>") == 1 and 0 < opened < closed, f"{title}: no single <details> answer block"
    assert "**Statement.**" in section[:opened], f"{title}: the statement is not above the answer"
    assert "```" not in section[:opened] and "```" not in section[closed:], f"{title}: code outside the answer"
    assert "**Explanation.**" in section[opened:closed], f"{title}: the explanation is not inside the answer"


@pytest.mark.parametrize("title", sorted(SECTIONS))
def test_printed_output_matches_the_code(title):
    for code, printed, expected in run_section(SECTIONS[title]):
        assert printed == expected, (f"docs/exercises.md, {title}: the page shows\n{expected}\nbut the code prints\n"
                                     f"{printed}\n(rewrite with `python tests/test_exercises.py --write`)")


@pytest.mark.parametrize("title", sorted(SECTIONS))
def test_numbers_in_the_prose_come_from_the_code(title):
    section = SECTIONS[title]
    sources = " ".join(m["code"] + " " + m["output"] for m in _PAIR.finditer(section))
    known = {float(x) for x in _DECIMAL.findall(sources)}
    prose = _BLOCK.sub(" ", section)
    stray = [x for x in _DECIMAL.findall(prose) if float(x) not in known]
    assert not stray, f"docs/exercises.md, {title}: the prose quotes {stray}, which no code or output shows"


def write_outputs() -> None:
    """Rerun every exercise and rewrite its output blocks in place."""
    text = EXERCISES.read_text()
    for title, section in exercise_sections(text).items():
        namespace: dict = {"__name__": "exercise"}

        def fill(match):
            printed = run_code(match["code"], namespace)
            start, end = match.span("output")
            relative = match.start()
            whole = match.group(0)
            return whole[: start - relative] + printed + whole[end - relative:]

        text = text.replace(section, _PAIR.sub(fill, section))
    EXERCISES.write_text(text)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_outputs()
    else:
        sys.exit(pytest.main([__file__, "-q"]))
