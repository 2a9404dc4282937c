"""The manual cannot drift from the code, and the README stays a front page.

- docs/configuration.md documents every key the settings models accept, and no other: each
  reference table (a `### ` heading naming one or more blocks as code spans, e.g.
  "### `pipelines[].from_changelog`", or "### Top level") lists in its first column exactly the
  keys the model of that block accepts, and every block of the models has a table.
- Every relative link in README.md and docs/ points to a file (and heading) that exists, and every
  repository path the README and the manual name exists.
- README.md is a front page: short, with exactly the two set-up commands, and its minimal config
  (like the complete example in docs/configuration.md) is a valid configuration; its Architecture
  tree has one line per folder, each folder of the tree exists and every package folder is in it.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path

import pytest
from pydantic import AliasChoices, AliasPath, BaseModel

from service.config.settings import Settings, settings_from_mapping

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
TOP_LEVEL = ""
MAX_README_LINES = 200
SET_UP_COMMANDS = ["bash scripts/demo.sh", "bash scripts/test.sh"]

_HEADING = re.compile(r"^### (.*)$")
_CODE = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _models_in(annotation: typing.Any) -> tuple[type[BaseModel], ...]:
    """The settings models a field's type holds: itself, or inside Optional, unions, lists, dicts."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return (annotation,)
    found: list[type[BaseModel]] = []
    for argument in typing.get_args(annotation):
        for model in _models_in(argument):
            if model not in found:
                found.append(model)
    return tuple(found)


def accepted_keys(model: type[BaseModel]) -> set[str]:
    """Every key a model accepts: field names, and the aliases it validates by."""
    config = model.model_config
    by_name = bool(config.get("populate_by_name") or config.get("validate_by_name"))
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        aliases: list[str] = []
        alias = field.validation_alias if field.validation_alias is not None else field.alias
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias] if alias is not None else []
        for choice in choices:
            if isinstance(choice, AliasPath):
                choice = choice.path[0]
            if isinstance(choice, str):
                aliases.append(choice)
        keys.update(aliases)
        if not aliases or by_name:
            keys.add(name)
    return keys


def blocks() -> dict[str, tuple[type[BaseModel], ...]]:
    """Every block of the configuration (its path, e.g. `pipelines[].from_changelog`) -> its model(s).

    A list or tuple of models is written `name[]`; a union (the kinds of join) is one block whose
    keys are those of all its models.
    """
    found: dict[str, tuple[type[BaseModel], ...]] = {TOP_LEVEL: (Settings,)}
    pending = [TOP_LEVEL]
    while pending:
        path = pending.pop()
        for model in found[path]:
            for name, field in model.model_fields.items():
                models = _models_in(field.annotation)
                if not models:
                    continue
                origin = typing.get_origin(field.annotation)
                many = origin in (list, tuple) or _is_sequence(field.annotation)
                child = f"{path}.{name}" if path else name
                child += "[]" if many else ""
                if child not in found:
                    found[child] = models
                    pending.append(child)
    return found


def _is_sequence(annotation: typing.Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_is_sequence(argument) for argument in typing.get_args(annotation))
    return False


def block_keys(models: tuple[type[BaseModel], ...]) -> set[str]:
    """The keys of a block: those of its model, or of every model of a union."""
    return set().union(*(accepted_keys(model) for model in models))


def documented_blocks(text: str) -> dict[str, set[str]]:
    """The reference tables of docs/configuration.md: block path -> keys in the first column."""
    tables: dict[str, set[str]] = {}
    current: list[str] | None = None
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        heading = _HEADING.match(line)
        if heading or line.startswith("## ") or line.startswith("# "):
            title = heading.group(1).strip() if heading else ""
            paths = _CODE.findall(title)
            current = [TOP_LEVEL] if title == "Top level" else paths or None
            for path in current or ():
                tables.setdefault(path, set())
            continue
        if current and line.startswith("| `"):
            first_cell = line.split("|")[1]
            for path in current:
                tables[path].update(_CODE.findall(first_cell))
    return tables


def test_every_block_of_the_models_has_a_reference_table():
    documented = documented_blocks(CONFIGURATION.read_text())
    all_blocks = blocks()
    covered = {all_blocks[path] for path in documented if path in all_blocks}
    missing = sorted(path or "(top level)" for path, models in all_blocks.items() if models not in covered)
    assert not missing, f"docs/configuration.md has no reference table for: {missing}"


def test_every_documented_block_exists():
    unknown = sorted(set(documented_blocks(CONFIGURATION.read_text())) - set(blocks()))
    assert not unknown, f"docs/configuration.md documents blocks the settings models do not have: {unknown}"


def test_each_reference_table_lists_exactly_the_keys_of_its_block():
    all_blocks = blocks()
    problems = []
    for path, keys in documented_blocks(CONFIGURATION.read_text()).items():
        if path not in all_blocks:
            continue
        accepted = block_keys(all_blocks[path])
        name = path or "(top level)"
        if accepted - keys:
            problems.append(f"{name}: undocumented keys {sorted(accepted - keys)}")
        if keys - accepted:
            problems.append(f"{name}: documented keys the model does not accept {sorted(keys - accepted)}")
    assert not problems, "docs/configuration.md drifted from the settings models:\n" + "\n".join(problems)


def documented_defaults(text: str) -> dict[str, dict[str, str]]:
    """Block path -> key -> the value the default column starts with (rows whose default is prose,
    such as "required" or "see below", are left out)."""
    defaults: dict[str, dict[str, str]] = {}
    current: list[str] | None = None
    for line in re.sub(r"```.*?```", "", text, flags=re.S).splitlines():
        heading = _HEADING.match(line)
        if heading or line.startswith("## "):
            title = heading.group(1).strip() if heading else ""
            current = [TOP_LEVEL] if title == "Top level" else _CODE.findall(title) or None
            continue
        if current and line.startswith("| `"):
            cells = line.split("|")
            value = re.match(r"\s*`([^`]+)`", cells[2])
            if value:
                for path in current:
                    for key in _CODE.findall(cells[1]):
                        defaults.setdefault(path, {})[key] = value.group(1)
    return defaults


def _model_default(model: type[BaseModel], key: str) -> typing.Any:
    for name, field in model.model_fields.items():
        if key == name or key in _aliases_of(model, name):
            if field.is_required():
                return "required"
            return field.get_default(call_default_factory=True)
    raise KeyError(key)


def _aliases_of(model: type[BaseModel], name: str) -> set[str]:
    alias = model.model_fields[name].validation_alias
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias] if alias is not None else []
    return {choice for choice in choices if isinstance(choice, str)}


def _plain(value: typing.Any) -> typing.Any:
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def test_documented_defaults_are_the_models_defaults():
    import yaml

    all_blocks = blocks()
    wrong = []
    for path, defaults in documented_defaults(CONFIGURATION.read_text()).items():
        for key, shown in defaults.items():
            for model in all_blocks.get(path, ()):
                try:
                    actual = _model_default(model, key)
                except KeyError:
                    continue
                if isinstance(actual, BaseModel):
                    continue
                same = shown == actual if isinstance(actual, str) else yaml.safe_load(shown) == _plain(actual)
                if not same:
                    wrong.append(f"{path or '(top level)'}.{key}: documented {shown!r}, the model says {actual!r}")
    assert not wrong, "docs/configuration.md shows defaults the models do not have:\n" + "\n".join(wrong)


def test_the_walk_finds_the_nested_blocks():
    # Guards the test itself: nested models, lists of models and the union of join kinds are walked.
    all_blocks = blocks()
    assert {"kafka", "pipelines[]", "pipelines[].from_changelog", "exports[]", "joins[]",
            "joins[].left", "schema_registry"} <= set(all_blocks)
    assert len(all_blocks["joins[]"]) == 2
    assert {"ssl.ca.location", "ssl_ca_location"} <= accepted_keys(all_blocks["schema_registry"][0])


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_point_to_existing_files(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files or headings: {broken}"


def _anchors(page: Path) -> set[str]:
    """The heading anchors GitHub gives a page: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    headings = re.findall(r"^#{1,6} (.*)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


_TOP_FOLDERS = "service|connectors|vocabulary|tests|testbed|bench|deploy|scripts|docs"
_REPO_PATH = re.compile(rf"(?<![\w/.-])((?:{_TOP_FOLDERS})/[\w./-]*\w/?)")


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda path: str(path.relative_to(ROOT)))
def test_named_repository_paths_exist(page: Path):
    # The manual names modules, tests and files by path: a move must take the manual with it.
    missing = sorted({path for path in _REPO_PATH.findall(page.read_text()) if not (ROOT / path).exists()})
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_modules_of_the_architecture_walk_exist():
    # docs/architecture.md names modules by their folder inside a package: each must still exist.
    names = set(re.findall(r"([\w/]+\.py)\b", (DOCS / "architecture.md").read_text()))
    modules = {str(path.relative_to(ROOT)) for root in PACKAGE_ROOTS for path in (ROOT / root).rglob("*.py")}
    missing = sorted(name for name in names if not any(module.endswith("/" + name) or module == name
                                                       for module in modules))
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"no section {title!r}"
    return match.group(1)


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: the reference belongs in docs/"


def test_readme_set_up_block_holds_exactly_the_two_commands():
    (block,) = _code_blocks(_section(README.read_text(), "Two commands"), "bash")
    commands = [line.strip() for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands == SET_UP_COMMANDS


def test_readme_links_every_page_of_the_manual():
    readme = README.read_text()
    pages = sorted(page.name for page in DOCS.glob("*.md"))
    assert pages, "docs/ has no pages"
    unlinked = [name for name in pages if f"(docs/{name}" not in readme]
    assert not unlinked, f"README.md does not link {unlinked}"


def test_readme_minimal_configs_are_valid():
    one_table, database = _code_blocks(_section(README.read_text(), "A minimal configuration"), "yaml")
    assert settings_from_mapping(_yaml(one_table), "README.md").pipelines
    (source,) = settings_from_mapping(_yaml(database), "README.md").databases
    assert len(database.strip().splitlines()) < 15  # a whole database in under 15 lines
    assert source.routes(["dbserver1.public.orders", "dbserver1.inventory.customers", "other.public.x"]) == {
        "dbserver1.inventory.customers": "inventory_customers", "dbserver1.public.orders": "public_orders"}


def test_complete_example_config_is_valid(monkeypatch):
    (config,) = _code_blocks(_section(CONFIGURATION.read_text(), "A complete example"), "yaml")
    for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", config):
        monkeypatch.setenv(name, "user:secret")
    settings = settings_from_mapping(_yaml(config), "docs/configuration.md")
    assert settings.pipelines


_NOT_PROJECT = {"build", "spark-warehouse", "metastore_db", "__pycache__"}
PACKAGE_ROOTS = ("vocabulary", "connectors", "service")


def readme_tree() -> list[str]:
    """The folders of the README's Architecture tree, as paths from the repository root."""
    architecture = _section(README.read_text(), "Architecture")
    (tree,) = [block for block in _code_blocks(architecture, "") if block.startswith("vocabulary/")]
    folders: list[str] = []
    stack: list[str] = []
    for line in tree.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.endswith("/"):
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        stack[depth:] = [name.rstrip("/")]
        folders.append("/".join(stack))
    return folders


def project_folders() -> set[str]:
    """The folders the tree must show: every Python package of the product, every folder of
    tests/, and every other top-level folder of the repository."""
    folders = {path.name for path in ROOT.iterdir()
               if path.is_dir() and not path.name.startswith(".") and path.name not in _NOT_PROJECT
               and not path.name.endswith(".egg-info")}
    folders |= {f"tests/{path.name}" for path in (ROOT / "tests").iterdir()
                if path.is_dir() and path.name not in _NOT_PROJECT}
    for root in PACKAGE_ROOTS:
        folders |= {str(init.parent.relative_to(ROOT)) for init in (ROOT / root).rglob("__init__.py")}
    return folders


def test_readme_tree_shows_every_folder_once():
    folders = readme_tree()
    assert len(folders) == len(set(folders)), "a folder appears twice in the README tree"
    missing_on_disk = sorted(folder for folder in folders if not (ROOT / folder).is_dir())
    assert not missing_on_disk, f"the README tree shows folders that do not exist: {missing_on_disk}"
    not_shown = sorted(project_folders() - set(folders))
    assert not not_shown, f"the README tree leaves out: {not_shown}"


def _yaml(text: str) -> dict:
    import yaml

    return yaml.safe_load(text)
