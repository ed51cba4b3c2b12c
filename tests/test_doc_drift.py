"""Docs that cannot drift: every place the docs point into the code is checked against it.

- The folder tree of docs/reading-guide.md ("The layout") holds the repository's top-level
  folders and every folder of ppo/, no folder that does not exist, and the files each line
  names exist in its folder.
- The module map of the reading guide names only modules that exist, and every module of
  ppo/ is in it.
- The phase banners the guide quotes are the banners of `RLTrainer.train_step`, all of them,
  and every "train_step (N. phase)" in the docs names a banner that is there.
- Every code location cited in README.md and the pages under docs/ exists: a path into this
  repository (`ppo/trainer.py`, a link to it, `tests/test_x.py::test_y`), each name cited
  right after a Python file (`ppo/trainer.py` `RLTrainer._advantages`, or
  `ppo/trainer.py: name`) as a definition in that file, `Class.attribute` of a project class
  cited alone (`RLTrainer._update`) as something the class has, a dotted name
  (`ppo.algorithm.losses.aggregate`) importable, and `python -m MODULE` a module.
- Every page that cites "the N+ implementation details" links the paper at its first citation.
- docs/alpacafarm.md's "Our field = value" column quotes `preset("alpacafarm")`.
- Each checker fails on a planted wrong location (the self-tests at the end).

tests/test_docs.py checks the catalogue's rows against `PPOConfig` and the presets, and that
relative links resolve; this file checks what the docs say about where the code is. The
failures list every wrong location (page, line, what is missing), so one run says all there
is to fix.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

import pytest
from test_docs import catalogue_rows

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDE = DOCS / "reading-guide.md"
CATALOGUE = DOCS / "implementation-details.md"
TRAINER = ROOT / "ppo" / "trainer.py"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
N_PLUS_PAPER = "arxiv.org/abs/2403.17031"  # Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO"


# ---- the repository's folders ---------------------------------------------------------------

@lru_cache(maxsize=None)
def _ignore_patterns() -> tuple[str, ...]:
    return tuple(line.strip().rstrip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
                 if line.strip() and not line.startswith("#"))


def _ignored(name: str) -> bool:
    """A name .gitignore leaves out (run outputs, builds, caches), or a hidden one."""
    return name.startswith(".") or any(fnmatch.fnmatch(name, pattern) for pattern in _ignore_patterns())


def repository_folders() -> set[str]:
    """The top-level folders of the repository, as ``name/``."""
    return {f"{path.name}/" for path in ROOT.iterdir() if path.is_dir() and not _ignored(path.name)}


def package_folders(package: str = "ppo") -> set[str]:
    """`package` and every folder below it whose parent is a Python package (a package, or a
    data folder such as ``models/warm_start/``), as repository paths ending in ``/``."""
    top = ROOT / package
    found = {f"{package}/"}
    for path in top.rglob("*"):
        if path.is_dir() and not _ignored(path.name) and (path.parent / "__init__.py").exists():
            if all(not _ignored(part) for part in path.relative_to(ROOT).parts):
                found.add(f"{path.relative_to(ROOT).as_posix()}/")
    return found


def package_modules(package: str = "ppo") -> set[str]:
    """Every module file of `package` but the packages' ``__init__.py``, as repository paths."""
    return {path.relative_to(ROOT).as_posix() for path in (ROOT / package).rglob("*.py")
            if path.name != "__init__.py" and "__pycache__" not in path.parts}


def section(text: str, heading: str) -> str:
    """The text under the level-2 `heading`, up to the next level-2 heading ('' if none)."""
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    return match.group(1) if match else ""


# ---- (a) the folder tree ---------------------------------------------------------------------

_TREE_LINE = re.compile(r"^(?P<indent> *)(?P<entry>[\w.-]+/)(?P<description>.*)$")
_FILE_NAME = re.compile(r"(?<![\w/.-])([\w-]+\.(?:py|md|cfg|toml|yaml|json))\b")


def parse_tree(block: str) -> dict[str, list[str]]:
    """Folder path -> the file names its line mentions, from a tree written as one folder per
    line (``name/``, two spaces of indent per level, then its description)."""
    folders: dict[str, list[str]] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        match = _TREE_LINE.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] if stack else "") + match["entry"]
        stack.append((indent, path))
        folders[path] = _FILE_NAME.findall(match["description"])
    return folders


def layout_tree(text: str) -> dict[str, list[str]]:
    """The tree in the first code block of the "The layout" section."""
    block = re.search(r"```[^\n]*\n(.*?)```", section(text, "The layout"), flags=re.S)
    return parse_tree(block.group(1)) if block else {}


def tree_problems(tree: dict[str, list[str]]) -> list[str]:
    """What the layout tree gets wrong against the repository."""
    if not tree:
        return ["no folder tree in a code block under '## The layout'"]
    problems = []
    listed_top = {path for path in tree if path.count("/") == 1}
    for path in sorted(repository_folders() - listed_top):
        problems.append(f"top-level folder {path} is not in the tree")
    real_ppo = package_folders("ppo")
    for path in sorted(real_ppo - set(tree)):
        problems.append(f"folder {path} is not in the tree")
    for path in sorted(tree):
        if not (ROOT / path).is_dir():
            problems.append(f"the tree lists {path}, which does not exist")
        elif path.startswith("ppo/") and path not in real_ppo:
            problems.append(f"the tree lists {path}, which is not a folder of a package")
        for name in tree[path]:
            if not (ROOT / path / name).exists():
                problems.append(f"the tree's line for {path} names {name}, which is not in {path}")
    return problems


def test_the_layout_tree_is_the_repository():
    problems = tree_problems(layout_tree(GUIDE.read_text()))
    assert not problems, "docs/reading-guide.md, The layout:\n" + "\n".join(problems)


# ---- (b) the module map ----------------------------------------------------------------------

def _repository_path_pattern() -> re.Pattern:
    """A path into the repository: it starts with one of its top-level folders (after any
    ``../`` of a link), and is not the tail of another path (``verl/trainer/ppo/x.py``)."""
    roots = "|".join(re.escape(folder.rstrip("/")) for folder in sorted(repository_folders()))
    return re.compile(rf"(?<![\w./$~-])(?:\.\./)*(?P<path>(?:{roots})/[\w./-]*)")


REPO_PATH = _repository_path_pattern()


def repository_paths(text: str) -> list[tuple[int, str]]:
    """(offset, path) of every path into the repository that `text` mentions; a path that goes
    on as a pattern (``batch{15..42}.txt``, ``test_*.py``, ``<key>``) is left out."""
    found = []
    for match in REPO_PATH.finditer(text):
        end = match.end("path")
        if end < len(text) and text[end] in "*{<[$":
            continue
        found.append((match.start("path"), match["path"].rstrip(".")))
    return found


def map_problems(text: str) -> list[str]:
    """What the module map names that does not exist, and the modules of ppo/ it leaves out."""
    table = section(text, "Module map")
    if not table:
        return ["no '## Module map' section"]
    named = {path for _, path in repository_paths(table)}
    problems = [f"the map names {path}, which does not exist" for path in sorted(named)
                if not (ROOT / path).exists()]
    problems += [f"module {path} is not in the map" for path in sorted(package_modules("ppo") - named)]
    return problems


def test_the_module_map_is_every_module_of_ppo():
    problems = map_problems(GUIDE.read_text())
    assert not problems, "docs/reading-guide.md, Module map:\n" + "\n".join(problems)


# ---- (c) the phase banners -------------------------------------------------------------------

_BANNER = re.compile(r"^\s*#\s*-{2,}\s*(?P<text>\d+(?:-\d+)?\.\s.*?)\s*-*\s*$")
_BANNER_NUMBER = re.compile(r"^(?P<number>\d+(?:-\d+)?)\.\s*(?P<words>.*)$")


def trainer_banners(source: str | None = None) -> dict[str, str]:
    """Banner number (``"1-2"``) -> its full text, for every ``# ---- N. ... ----`` comment
    inside `RLTrainer.train_step`, in order."""
    source = TRAINER.read_text() if source is None else source
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "train_step":
            body = lines[node.lineno - 1:node.end_lineno]
            break
    else:
        return {}
    banners = {}
    for line in body:
        match = _BANNER.match(line)
        if match:
            text = match["text"]
            banners[_BANNER_NUMBER.match(text)["number"]] = text
    return banners


def banner_heading(text: str) -> str:
    """A banner's heading: its text up to the first colon (``7. update``)."""
    return text.split(":", 1)[0].strip()


def quoted_banners(text: str) -> list[tuple[int, str]]:
    """(line, text) of every inline-code span of `text` that reads as a banner (``N. ...``)."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for span in re.findall(r"`([^`\n]+)`", line):
            if re.match(r"^\d+(?:-\d+)?\.\s+\S", span):
                found.append((number, span))
    return found


def guide_banner_problems(text: str, banners: dict[str, str]) -> list[str]:
    """Banners the guide quotes that train_step does not have, and banners it leaves out."""
    if not banners:
        return ["no numbered banners found in RLTrainer.train_step"]
    problems = []
    quoted_numbers = set()
    for line, span in quoted_banners(text):
        number = _BANNER_NUMBER.match(span)["number"]
        quoted_numbers.add(number)
        banner = banners.get(number)
        if banner is None or not (span == banner_heading(banner) or banner.startswith(span)):
            expected = f"`{banner_heading(banner)}`" if banner else f"one of {sorted(banners)}"
            problems.append(f"line {line}: quotes the banner `{span}`; train_step has {expected}")
    for number in banners:
        if number not in quoted_numbers:
            problems.append(f"the banner `{banner_heading(banners[number])}` is not quoted")
    return problems


_PHASE_CITATION = re.compile(r"train_step`?\s*\((?P<number>\d+(?:-\d+)?)\.\s*(?P<words>[^)]*)\)")


def phase_citation_problems(text: str, banners: dict[str, str]) -> list[str]:
    """Every ``train_step (N. words)``: N must be a banner's number as written (``5-6``, not
    ``5``), and the words must be in that banner."""
    problems = []
    for match in _PHASE_CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        banner = banners.get(match["number"])
        words = match["words"].strip()
        if banner is None:
            problems.append(f"line {line}: `{match[0]}`: train_step has no banner {match['number']}. "
                            f"(its banners: {', '.join(sorted(banners))})")
        elif words and words.lower() not in banner.lower():
            problems.append(f"line {line}: `{match[0]}`: banner {match['number']} reads `{banner}`")
    return problems


def test_the_guide_quotes_every_banner_of_train_step():
    problems = guide_banner_problems(GUIDE.read_text(), trainer_banners())
    assert not problems, "docs/reading-guide.md against ppo/trainer.py train_step:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_train_step_phases_cited_are_banners(page):
    problems = phase_citation_problems(page.read_text(), trainer_banners())
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


# ---- (d) code locations ----------------------------------------------------------------------

_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")


def _scope_names(statements: list[ast.stmt]) -> dict[str, ast.AST]:
    """Name -> its definition, for the functions, classes and assignments of one scope
    (looking inside ``if`` / ``try`` / ``with`` blocks, not inside functions)."""
    names: dict[str, ast.AST] = {}
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for element in _assigned(target):
                    names[element] = node
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody"):
                names.update(_scope_names(getattr(node, block, [])))
            for handler in getattr(node, "handlers", []):
                names.update(_scope_names(handler.body))
    return names


def _assigned(target: ast.expr) -> list[str]:
    """The names an assignment target binds: ``a``, ``a, b``; not ``a.b`` or ``a[0]``."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _assigned(element)]
    if isinstance(target, ast.Starred):
        return _assigned(target.value)
    return []


def _class_names(node: ast.ClassDef) -> dict[str, ast.AST]:
    """What a class defines: its methods, class attributes and fields, and every
    ``self.name = ...`` its methods assign."""
    names = _scope_names(node.body)
    for method in node.body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for element in ast.walk(method):
                targets = []
                if isinstance(element, ast.Assign):
                    targets = element.targets
                elif isinstance(element, (ast.AnnAssign, ast.AugAssign)):
                    targets = [element.target]
                for target in targets:
                    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == "self"):
                        names.setdefault(target.attr, element)
    return names


@lru_cache(maxsize=None)
def _module_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _imported_names(tree: ast.Module) -> set[str]:
    return {(alias.asname or alias.name).split(".")[0] for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}


def defines(path: Path, dotted: str) -> bool:
    """Whether the Python file `path` defines `dotted` (``name``, ``Class.method``,
    ``Class.attribute``). A package's ``__init__.py`` also counts what it imports: that is
    the package's public surface."""
    tree = _module_tree(path)
    first, *rest = dotted.split(".")
    scope = _scope_names(tree.body)
    if first not in scope:
        return not rest and path.name == "__init__.py" and first in _imported_names(tree)
    node = scope[first]
    for part in rest:
        if not isinstance(node, ast.ClassDef):
            return False
        members = _class_names(node)
        if part not in members:
            return False
        node = members[part]
    return True


def python_file(path: str) -> Path | None:
    """The Python file a cited path names: the file, or a package folder's ``__init__.py``."""
    target = ROOT / path
    if target.is_file() and target.suffix == ".py":
        return target
    if target.is_dir() and (target / "__init__.py").exists():
        return target / "__init__.py"
    return None


_LINK = re.compile(r"\[(?P<label>[^\]]*)\]\((?P<target>[^)\s]+)\)")
_CODE_PATH = re.compile(r"`(?P<path>[^`\s:]+?)(?:(?P<sep>::|:\s*)(?P<name>[^`]+))?`")
_NAME_SPAN = re.compile(r"\s*`(?P<name>[^`]+)`")
_ARGUMENTS = re.compile(r"\s*\((?P<inside>[^()]*)\)")
_NAME_LIST = re.compile(r"^`[^`]+`(?:\s*(?:,|and|or)\s*`[^`]+`)*$")
_SEPARATOR = re.compile(r"\s*(?:,|\band\b|\bor\b)")


def _clean_name(name: str) -> str | None:
    """A cited name as an identifier (``f(x)`` -> ``f``, ``test_x[param]`` -> ``test_x``,
    ``a::b`` -> ``a.b``), or None when the span is not a name (a value, a flag, an expression)."""
    name = re.sub(r"\(.*\)$|\[.*\]$", "", name.strip()).replace("::", ".")
    return name if _IDENTIFIER.match(name) else None


def name_chain(text: str, start: int) -> tuple[list[str], int]:
    """The names cited right after a path that ends at `start`, and where their list ends:
    inline-code spans separated by commas, 'and' or 'or', optionally after a colon; a
    parenthesis right after the path may hold the list (``policy.py (`left_pad`, `prepare_tokenizer`)``),
    one after a name holds its arguments or a note and is skipped."""
    names: list[str] = []
    arguments = _ARGUMENTS.match(text, start)
    if arguments and _NAME_LIST.match(arguments["inside"].strip()):
        listed = [name for name in map(_clean_name, re.findall(r"`([^`]+)`", arguments["inside"])) if name]
        return listed, arguments.end()
    position = start
    colon = re.match(r"\s*:", text[position:])
    if colon:
        position += colon.end()
    while True:
        span = _NAME_SPAN.match(text, position)
        if not span or "\n\n" in text[position:span.start("name")]:
            return names, position
        name = _clean_name(span["name"])
        if name is None:
            return names, position
        names.append(name)
        position = span.end()
        arguments = _ARGUMENTS.match(text, position)
        if arguments:
            position = arguments.end()
        separator = _SEPARATOR.match(text, position)
        if not separator:
            return names, position
        position = separator.end()


def cited_names(text: str, start: int) -> list[str]:
    """The names `name_chain` reads after a path that ends at `start`."""
    return name_chain(text, start)[0]


def _without_links(text: str) -> str:
    """`text` with every markdown link replaced by its label, so that a linked path reads as
    the path itself (``[`ppo/x.py`](../ppo/x.py) `f``` -> ```ppo/x.py` `f```)."""
    return _LINK.sub(lambda match: match["label"], text)


def _importable(dotted: str) -> bool:
    """Whether `dotted` is a module, or a module and attributes inside it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module_name) is None:
                continue
        except ModuleNotFoundError:
            continue
        if cut == len(parts):
            return True
        try:
            value = importlib.import_module(module_name)
        except ImportError:
            return False
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def _packages() -> set[str]:
    return {path.parent.name for path in ROOT.glob("*/__init__.py")}


@lru_cache(maxsize=None)
def project_classes() -> dict[str, list[ast.ClassDef]]:
    """Class name -> its definitions in the project's packages."""
    classes: dict[str, list[ast.ClassDef]] = {}
    for package in sorted(_packages()):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(_module_tree(path)):
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, []).append(node)
    return classes


@lru_cache(maxsize=None)
def attributes_set_from_outside() -> frozenset[str]:
    """Attribute names the project assigns on some object other than ``self``
    (``trainer.policy_module = ...``): a class's attribute may be set where it is built."""
    names = set()
    for package in sorted(_packages()):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(_module_tree(path)):
                targets = node.targets if isinstance(node, ast.Assign) else []
                for target in targets:
                    for element in ast.walk(target):
                        if (isinstance(element, ast.Attribute) and isinstance(element.ctx, ast.Store)
                                and not (isinstance(element.value, ast.Name) and element.value.id == "self")):
                            names.add(element.attr)
    return frozenset(names)


def class_has(name: str, attribute: str, seen: tuple[str, ...] = ()) -> bool:
    """Whether a project class `name` (or a project class it derives from) has `attribute`."""
    for node in project_classes().get(name, []):
        if attribute in _class_names(node):
            return True
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id not in seen and class_has(base.id, attribute, seen + (name,)):
                return True
    return False


def location_problems(text: str) -> list[str]:
    """Every code location `text` cites that does not exist, as ``line N: what``."""
    problems: list[tuple[int, str]] = []

    def report(offset: int, source: str, message: str) -> None:
        problems.append((source.count("\n", 0, offset) + 1, message))

    # Paths anywhere: prose, inline code, link targets, code blocks.
    for offset, path in repository_paths(text):
        if not (ROOT / path).exists():
            report(offset, text, f"`{path}` does not exist")
    # Names cited after a Python file, links read as their labels.
    plain = _without_links(text)
    for match in _CODE_PATH.finditer(plain):
        cited = REPO_PATH.fullmatch(match["path"])
        if not cited:
            continue
        path = cited["path"]
        source = python_file(path)
        if source is None:
            continue
        names = [match["name"]] if match["name"] else cited_names(plain, match.end())
        for name in filter(None, map(_clean_name, names)):
            if not defines(source, name):
                report(match.start(), plain, f"`{path}` has no `{name}`")
    # `Class.attribute` of a class of this project, cited without a file; a name cited right
    # after a file is that file's (checked above when the file is ours: another repository's
    # `kl_controller.py` `AdaptiveKLController.step` is not).
    after_a_file = [(match.end(), name_chain(plain, match.end())[1]) for match in _CODE_PATH.finditer(plain)
                    if match["path"].endswith(".py") or REPO_PATH.fullmatch(match["path"])]
    for match in re.finditer(r"`(?P<cls>[A-Z]\w*)\.(?P<attribute>[A-Za-z_]\w*)(?:\([^`]*\))?`", plain):
        if match["cls"] not in project_classes() or any(start <= match.start() < end for start, end in after_a_file):
            continue
        if not class_has(match["cls"], match["attribute"]) and match["attribute"] not in attributes_set_from_outside():
            report(match.start(), plain, f"`{match['cls']}` has no `{match['attribute']}`")
    # Dotted names and modules run with python -m.
    packages = "|".join(sorted(_packages()))
    for match in re.finditer(rf"`(?P<name>(?:{packages})(?:\.[A-Za-z_]\w*)+)`", plain):
        if not _importable(match["name"]):
            report(match.start(), plain, f"`{match['name']}` cannot be imported")
    for match in re.finditer(rf"python -m (?P<module>(?:{packages})(?:\.[A-Za-z_]\w*)*)", plain):
        if importlib.util.find_spec(match["module"]) is None:
            report(match.start(), plain, f"`python -m {match['module']}`: no such module")
    # A linked path is cited twice, as label and target: say it once.
    return list(dict.fromkeys(f"line {line}: {message}" for line, message in sorted(problems, key=lambda p: p[0])))


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_code_locations_exist(page):
    problems = location_problems(page.read_text())
    assert not problems, f"{page.relative_to(ROOT)} cites code that is not there:\n" + "\n".join(problems)


def test_every_catalogue_row_cites_a_name_the_check_reads():
    """Each row's 'Where' cell names a file of this repository and a function, class or
    attribute in it, in the form the location check above reads (a path, then its names)."""
    unread = []
    for field, cells in catalogue_rows().items():
        plain = _without_links(cells["where"])
        names = [name for match in _CODE_PATH.finditer(plain)
                 if REPO_PATH.fullmatch(match["path"]) for name in cited_names(plain, match.end())]
        if not names:
            unread.append(field)
    assert not unread, f"catalogue rows whose 'Where' names no function, class or attribute: {unread}"


# ---- the N+ paper ----------------------------------------------------------------------------

def n_plus_problems(text: str) -> list[str]:
    """A page citing the N+ implementation details must link the paper at the first citation:
    before it, or in the same paragraph (table row)."""
    first = re.search(r"\bN\+", text)
    if not first:
        return []
    line_start = text.rfind("\n", 0, first.start()) + 1
    if text.startswith("|", line_start):
        end = text.find("\n", first.start())
    else:
        end = text.find("\n\n", first.start())
    end = len(text) if end < 0 else end
    link = text.find(N_PLUS_PAPER)
    if 0 <= link < end:
        return []
    line = text.count("\n", 0, first.start()) + 1
    return [f"line {line}: first cites N+ without a link to https://{N_PLUS_PAPER}"]


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_the_n_plus_paper_is_linked_where_first_cited(page):
    problems = n_plus_problems(page.read_text())
    assert not problems, f"{page.relative_to(ROOT)}: " + "\n".join(problems)


# ---- the AlpacaFarm page quotes the preset ------------------------------------------------------

_QUOTED_VALUE = re.compile(r"`(?P<field>\w+)` = (?P<value>.+?)(?=,\s*`|;|\s+\(|\s*$)")


def quoted_preset_values(text: str) -> list[tuple[int, str, str]]:
    """(line, field, value as written) for every ```field` = value`` in the third column of the
    settings table of docs/alpacafarm.md."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3:
            continue
        found += [(number, match["field"], match["value"]) for match in _QUOTED_VALUE.finditer(cells[2])]
    return found


def test_the_alpacafarm_page_quotes_the_preset():
    """docs/alpacafarm.md's "Our field = value" column: each value is `preset("alpacafarm")`'s
    (a page that once said the testbed's `max_prompt_length` was 64, while its runs used 192)."""
    from ppo.config import preset

    config = preset("alpacafarm")
    text = section((DOCS / "alpacafarm.md").read_text(), "AlpacaFarm's PPO settings and where they live here")
    quoted = quoted_preset_values(text)
    wrong = []
    for line, field, written in quoted:
        try:
            value = ast.literal_eval(written)
        except (ValueError, SyntaxError):
            wrong.append(f"line {line}: `{field}` = {written} is not a Python literal")
            continue
        if not hasattr(config, field) or getattr(config, field) != value:
            actual = getattr(config, field, "no such field")
            wrong.append(f"line {line}: `{field}` = {written}; preset('alpacafarm') has {actual!r}")
    assert len(quoted) > 30
    assert not wrong, "docs/alpacafarm.md:\n" + "\n".join(wrong)


# ---- (e) the checkers catch what they are for ------------------------------------------------

def test_a_planted_wrong_location_is_caught():
    good = "[`ppo/trainer.py`](../ppo/trainer.py) `RLTrainer._advantages`, `RLTrainer._update`"
    assert location_problems(good) == []
    wrong_name = "[`ppo/trainer.py`](../ppo/trainer.py) `RLTrainer._advantages`, `RLTrainer._advantage_estimates`"
    assert location_problems(wrong_name) == ["line 1: `ppo/trainer.py` has no `RLTrainer._advantage_estimates`"]
    moved = "Presets are in `ppo/config.py` `PRESETS`, the losses in\n[`ppo/loss.py`](../ppo/loss.py): `aggregate`."
    assert location_problems(moved) == ["line 1: `ppo/config.py` has no `PRESETS`",
                                        "line 2: `ppo/loss.py` does not exist"]
    assert location_problems("`tests/test_gae.py::test_no_such_test`") == [
        "line 1: `tests/test_gae.py` has no `test_no_such_test`"]
    assert location_problems("`ppo.algorithm.losses.no_such_loss` and `python -m ppo.no_such_module`") == [
        "line 1: `ppo.algorithm.losses.no_such_loss` cannot be imported",
        "line 1: `python -m ppo.no_such_module`: no such module"]
    assert location_problems("`RLTrainer._advantages` and `ForwardPasses.no_such_pass`; `RLTrainer.policy_module`") == [
        "line 1: `ForwardPasses` has no `no_such_pass`"]
    # Other repositories' paths and patterns are not ours to check.
    assert location_problems("verl's `verl/trainer/ppo/core_algos.py` `compute_gae`; `tests/test_*.py`; "
                             "AlpacaFarm's `kl_controller.py` `AdaptiveKLController.step`") == []


def test_a_wrong_phase_citation_is_caught():
    banners = trainer_banners()
    assert "5-6" in banners and "7" in banners
    assert phase_citation_problems("[`ppo/trainer.py`](x) `RLTrainer.train_step` (5-6. rewards)", banners) == []
    problems = phase_citation_problems("`RLTrainer.train_step` (6. advantages)", banners)
    assert len(problems) == 1 and "no banner 6." in problems[0]
    problems = phase_citation_problems("`RLTrainer.train_step` (7. rollout)", banners)
    assert len(problems) == 1 and "banner 7 reads" in problems[0]


def test_a_wrong_banner_quote_is_caught():
    source = '''
class T:
    def train_step(self):
        # ---- 1-2. rollout and score: sample ----------------
        x = 1
        # ---- 3. update ---------------------------------------
        return x
'''
    banners = trainer_banners(source)
    assert banners == {"1-2": "1-2. rollout and score: sample", "3": "3. update"}
    assert guide_banner_problems("(`1-2. rollout and score`, `3. update`)", banners) == []
    assert guide_banner_problems("(`1. rollout`, `2. score`, `3. update`)", banners) == [
        "line 1: quotes the banner `1. rollout`; train_step has one of ['1-2', '3']",
        "line 1: quotes the banner `2. score`; train_step has one of ['1-2', '3']",
        "the banner `1-2. rollout and score` is not quoted"]


def test_a_wrong_tree_and_map_are_caught():
    tree = parse_tree("ppo/          top: config.py, nothing.py\n  algorithm/  math\n  nowhere/    gone\n"
                      "gae/          estimators\n")
    assert tree == {"ppo/": ["config.py", "nothing.py"], "ppo/algorithm/": [], "ppo/nowhere/": [], "gae/": []}
    problems = tree_problems(tree)
    assert "top-level folder tests/ is not in the tree" in problems
    assert "folder ppo/run/ is not in the tree" in problems
    assert "the tree lists ppo/nowhere/, which does not exist" in problems
    assert "the tree's line for ppo/ names nothing.py, which is not in ppo/" in problems
    problems = map_problems("## Module map\n\n| [`ppo/trainer.py`](../ppo/trainer.py) | x |\n"
                            "| [`ppo/nowhere.py`](../ppo/nowhere.py) | y |\n")
    assert "the map names ppo/nowhere.py, which does not exist" in problems
    assert "module ppo/algorithm/kl.py is not in the map" in problems
    assert "module ppo/trainer.py is not in the map" not in problems


def test_an_unlinked_n_plus_citation_is_caught():
    assert n_plus_problems("No citation here.") == []
    assert n_plus_problems("As [N+](https://arxiv.org/abs/2403.17031) says.\n\nN+ again.") == []
    assert n_plus_problems("| row | N+ implementation details |\n| x | [N+](https://arxiv.org/abs/2403.17031) |") == [
        "line 1: first cites N+ without a link to https://arxiv.org/abs/2403.17031"]
