"""The teaching docs stay in step with the code.

- Every `PPOConfig` field has a row in docs/implementation-details.md, and every row names a
  field that exists (a new toggle without a row, or a removed one with a stale row, fails).
- The AlpacaFarm / TRL columns quote the `alpacafarm` / `trl_ppo` presets correctly.
- Every relative link in README.md and the pages under docs/ points to a file that exists.
- Every preset and every testbed-scaled field is described in the "Presets" section.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import fields
from pathlib import Path

import pytest

from ppo.config import PRESETS, TESTBED_ADJUSTMENTS, TESTBED_SCALE, PPOConfig

DOCS = Path(__file__).resolve().parent.parent / "docs"
CATALOGUE = DOCS / "implementation-details.md"
DOC_FILES = [DOCS.parent / "README.md", *sorted(DOCS.rglob("*.md"))]  # every page, generated reports too

FIELD_NAMES = [f.name for f in fields(PPOConfig)]
COLUMNS = ("field", "what", "why", "source", "alpacafarm", "trl", "where")
# Columns of the catalogue that quote a preset, and the preset each one quotes.
PRESET_COLUMNS = {"alpacafarm": "alpacafarm", "trl": "trl_ppo"}

_ROW = re.compile(r"^\|\s*`(?P<name>[A-Za-z_][A-Za-z0-9_]*)`\s*\|")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_LEADING_LITERAL = re.compile(r"^`([^`]+)`")


def catalogue_rows() -> dict[str, dict[str, str]]:
    """Field name -> its row's cells, keyed by `COLUMNS`."""
    rows: dict[str, dict[str, str]] = {}
    for number, line in enumerate(CATALOGUE.read_text().splitlines(), start=1):
        match = _ROW.match(line)
        if not match:
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == len(COLUMNS), (
            f"{CATALOGUE.name}:{number}: row `{match['name']}` has {len(cells)} cells, expected "
            f"{len(COLUMNS)} ({', '.join(COLUMNS)}); a '|' inside a cell splits it")
        assert match["name"] not in rows, f"{CATALOGUE.name}:{number}: second row for `{match['name']}`"
        rows[match["name"]] = dict(zip(COLUMNS, cells))
    return rows


def section(text: str, heading: str) -> str:
    """The text under the level-2 `heading`, up to the next level-2 heading."""
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"no '## {heading}' section in {CATALOGUE.name}"
    return match.group(1)


def test_every_config_field_has_a_row():
    rows = catalogue_rows()
    missing = [name for name in FIELD_NAMES if name not in rows]
    assert not missing, f"PPOConfig fields without a row in docs/implementation-details.md: {missing}"


def test_every_field_name_appears_in_backticks():
    text = CATALOGUE.read_text()
    missing = [name for name in FIELD_NAMES if f"`{name}`" not in text]
    assert not missing, f"PPOConfig fields never written as `name` in docs/implementation-details.md: {missing}"


def test_no_row_for_a_field_that_does_not_exist():
    stale = sorted(set(catalogue_rows()) - set(FIELD_NAMES))
    assert not stale, f"docs/implementation-details.md has rows for unknown PPOConfig fields: {stale}"


def test_every_row_says_where_the_code_is():
    rows = catalogue_rows()
    no_link = [name for name, cells in rows.items() if not _LINK.search(cells["where"])]
    assert not no_link, f"rows whose 'where' cell has no link to a file: {no_link}"


def _same_value(quoted, expected) -> bool:
    if isinstance(expected, bool) or expected is None or isinstance(quoted, bool) or quoted is None:
        return quoted is expected
    if isinstance(expected, (int, float)) and isinstance(quoted, (int, float)):
        return math.isclose(quoted, expected, rel_tol=1e-9, abs_tol=0.0)
    return quoted == expected


@pytest.mark.parametrize("column", sorted(PRESET_COLUMNS))
def test_preset_columns_quote_the_presets(column):
    """A preset's value must be quoted; a field the preset leaves alone reads 'default' or '—'."""
    preset_name = PRESET_COLUMNS[column]
    overrides = PRESETS[preset_name]
    defaults = PPOConfig()
    wrong = []
    for name, cells in catalogue_rows().items():
        if name not in FIELD_NAMES:
            continue
        cell = cells[column]
        literal = _LEADING_LITERAL.match(cell)
        if name in overrides:
            if not literal:
                wrong.append(f"{name}: preset sets {overrides[name]!r}, the cell says {cell!r}")
                continue
            expected = overrides[name]
        elif literal:
            expected = getattr(defaults, name)  # a quoted value the preset does not set must be ours
        else:
            if not (cell.startswith("default") or cell.startswith("—")):
                wrong.append(f"{name}: expected 'default', '—' or a `value`, got {cell!r}")
            continue
        try:
            quoted = ast.literal_eval(literal.group(1))
        except (ValueError, SyntaxError):
            wrong.append(f"{name}: `{literal.group(1)}` is not a Python literal")
            continue
        if not _same_value(quoted, expected):
            wrong.append(f"{name}: the cell quotes {quoted!r}, {preset_name} gives {expected!r}")
    assert not wrong, f"column '{column}' disagrees with PRESETS[{preset_name!r}]:\n" + "\n".join(wrong)


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda path: path.relative_to(DOCS.parent).as_posix())
def test_relative_links_point_to_existing_files(doc):
    assert doc.exists(), f"{doc} is missing"
    broken = []
    for target in _LINK.findall(doc.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # external URL or an anchor in the same page
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{doc.name}: links to missing files: {broken}"


def heading_anchors(text: str) -> set[str]:
    r"""The anchors GitHub makes for a page's headings (lower case, punctuation but ``-`` and ``_``
    dropped, spaces as ``-``, a repeated heading suffixed ``-1``, ``-2``...), outside code fences.

    >>> sorted(heading_anchors("# The course's claims\n## `ppo` vs GRPO: 5 seeds\n## Notes\n## Notes"))
    ['notes', 'notes-1', 'ppo-vs-grpo-5-seeds', 'the-courses-claims']
    """
    anchors, seen, fenced = set(), {}, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda path: path.relative_to(DOCS.parent).as_posix())
def test_links_to_a_section_name_one_that_exists(doc):
    """A link ``page.md#section`` (or ``#section`` in the page) names a heading of that page."""
    broken = []
    for target in _LINK.findall(doc.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or "#" not in target:
            continue
        page, section = target.split("#", 1)
        path = (doc.parent / page).resolve() if page else doc
        if path.suffix == ".md" and path.exists() and section not in heading_anchors(path.read_text()):
            broken.append(target)
    assert not broken, f"{doc.name}: links to sections that are not there: {broken}"


def test_every_preset_is_described():
    presets = section(CATALOGUE.read_text(), "Presets")
    missing = [name for name in PRESETS if f"`{name}`" not in presets]
    assert not missing, f"presets not described in the Presets section: {missing}"


def test_testbed_scaling_is_described():
    presets = section(CATALOGUE.read_text(), "Presets")
    names = set(TESTBED_SCALE) | {key for adjust in TESTBED_ADJUSTMENTS.values() for key in adjust}
    missing = sorted(name for name in names if f"`{name}`" not in presets)
    assert not missing, f"fields changed by --testbed but not named in the Presets section: {missing}"


def test_every_image_under_docs_is_shown_somewhere():
    """A PNG under docs/ that no markdown page links to is dead weight in every clone. Links
    resolve relative to their page."""
    root = DOCS.parent
    linked = {(page.parent / target).resolve()
              for page in [root / "README.md", *DOCS.rglob("*.md")]
              for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text())}
    unlinked = sorted(str(p.relative_to(root)) for p in DOCS.rglob("*.png") if p.resolve() not in linked)
    assert not unlinked, f"images no markdown page shows: {unlinked}"


def test_every_test_named_in_the_reliability_doc_exists():
    """docs/reliability.md ties each case to a test by name: a renamed or removed test would
    leave a case that nothing checks."""
    text = (DOCS / "reliability.md").read_text()
    named = set(re.findall(r"`(test_[a-z0-9_]+)`", text))
    defined = {match for path in (DOCS.parent / "tests").glob("test_*.py")
               for match in re.findall(r"^def (test_[a-z0-9_]+)\(", path.read_text(), flags=re.MULTILINE)}
    assert len(named) > 60
    assert sorted(named - defined) == []
