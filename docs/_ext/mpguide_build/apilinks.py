"""Links into the ecosystem: API names to their official pages, issues and upstream files to GitHub.

There is no network at build time, so the targets live in the repository: ``docs/_inventories/apis.toml``
names each PyTorch and Lightning object the guide mentions, its page and the stored copy it was checked
against; ``python -m mpguide_build.apilinks write`` turns it into the Sphinx inventories beside it,
which ``intersphinx`` reads (``conf.py``), so explicit roles such as ``{py:class}`torch.autocast``` link too.

Three build steps, each on the doctree after it is read, so prose needs no markup of its own:

* **API names.** An inline code literal naming a known API (``GradScaler``, ``self.manual_backward(loss)``,
  ``torch.autocast``) becomes a cross-reference that intersphinx (or this site's own API reference)
  resolves. A literal that *looks* like an API name (:func:`looks_like_api`) but has no entry is a warning
  on the guide's pages (not on gallery pages, whose classes are the examples' own), and so is an entry
  whose target the inventories lack; ``-W`` builds fail on both.
* **Issues and pull requests.** "Lightning #12600", "issue #20970", "pull request #21436" and "PyTorch
  pull request #165068" in prose link to GitHub through the ``extlinks`` of ``conf.py``.
* **Upstream files.** A literal such as ``plugins/precision/amp.py`` or ``torch/amp/grad_scaler.py`` that
  names a file of the installed Lightning or torch links to that file on GitHub at the installed release
  (the one this build verified), on every page but those of :data:`FILE_LINK_SKIP` (which compare releases).
"""

from __future__ import annotations

import argparse
import builtins
import functools
import importlib.metadata
import importlib.util
import re
import sys
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib
from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

INVENTORIES = Path(__file__).resolve().parents[2] / "_inventories"
TABLE = INVENTORIES / "apis.toml"
#: Pages that compare releases: a bare file name there means several releases, so it is not linked to one.
FILE_LINK_SKIP = ("releases",)
#: Pages whose API-looking names without a target are not flagged (docstrings naming internals).
NAMES_UNCHECKED = ("api",)
_NAME = re.compile(r"^([A-Za-z_][\w.]*)(\(.*\))?$")
_ROOTS = ("torch.", "lightning.", "pl.", "L.", "nn.", "F.")
#: How prose cites issues and pull requests; the extlinks role each becomes.
_CITATION = re.compile(r"\b(?:(PyTorch) pull request|(Lightning)|pull request|issue) #(\d{3,6})\b")


@dataclass(frozen=True)
class Api:
    """One entry of the table: the object, its project and role, its uri in the project's inventory."""

    name: str
    project: str
    role: str
    uri: str = ""
    checked: str = ""


@dataclass(frozen=True)
class Table:
    """The parsed ``apis.toml``: projects' base URLs, spellings -> entry, unlinked names -> reason."""

    bases: dict[str, str]
    spellings: dict[str, Api]
    unlinked: dict[str, str]
    entries: tuple[Api, ...]


class TableError(Exception):
    """``apis.toml`` is malformed; the message names the entry and the field."""


def load_table(path: Path = TABLE) -> Table:
    """Read and check ``apis.toml``.

    Raises:
        TableError: a field is missing, a project unknown, or a spelling claimed by two entries.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise TableError(f"{path}: {err}") from None
    bases = {name: project["base"] for name, project in data.get("projects", {}).items()}
    spellings: dict[str, Api] = {}
    entries = []
    for i, raw in enumerate(data.get("api", [])):
        missing = [k for k in ("name", "project", "role", "spellings") if k not in raw]
        external = raw.get("project") != "mpguide"
        if external and not ({"uri", "checked"} <= set(raw)):
            missing += [k for k in ("uri", "checked") if k not in raw]
        if missing:
            raise TableError(f"{path}: api entry {i} ({raw.get('name', '?')}) lacks {missing}")
        if external and raw["project"] not in bases:
            raise TableError(f"{path}: {raw['name']}: unknown project {raw['project']!r}; known: {sorted(bases)}")
        api = Api(raw["name"], raw["project"], raw["role"], raw.get("uri", ""), raw.get("checked", ""))
        entries.append(api)
        for spelling in [raw["name"], *raw["spellings"]]:
            other = spellings.get(spelling)
            if other is not None and other.name != api.name:
                raise TableError(f"{path}: spelling {spelling!r} names both {other.name} and {api.name}")
            spellings[spelling] = api
    unlinked = {item["name"]: item["reason"] for item in data.get("unlinked", [])}
    return Table(bases, spellings, unlinked, tuple(entries))


@functools.cache
def _table() -> Table:
    """The table, read once per process (the build reads it for every page)."""
    return load_table()


def spelling(text: str) -> str:
    """The name an inline literal spells: ``self.`` and a call's arguments dropped (``""`` when none)."""
    text = text.strip()
    match = _NAME.match(text.removeprefix("self."))
    return match.group(1) if match else ""


def lookup(text: str, table: Table) -> Api | None:
    """The entry an inline literal names (``self.x`` is tried as written, then as ``x``), or None."""
    bare = spelling(text)
    if not bare:
        return None
    written = "self." + bare if text.strip().startswith("self.") else bare
    return table.spellings.get(written) or table.spellings.get(bare)


def looks_like_api(text: str) -> bool:
    """True when an inline literal looks like a PyTorch or Lightning API name, known or not.

    The rule: a dotted name under ``torch.``, ``lightning.``, ``pl.``, ``L.``, ``nn.`` or ``F.``; ``self.x`` with
    one attribute; or a CamelCase name that is not a Python builtin (``GradScaler``, ``Trainer.fit``). Each may
    end in a call. Lowercase bare names (``zero_grad``) are linked when known and never flagged.
    """
    name = spelling(text)
    if not name or name.endswith("."):  # a namespace in prose ("``torch.``"), not an object
        return False
    if text.strip().startswith("self."):
        return "." not in name
    head = name.split(".")[0]
    camel = head[:1].isupper() and any(c.islower() for c in head) and not hasattr(builtins, head)
    return name.startswith(_ROOTS) or camel


def unlinked_names(texts: Iterable[str], table: Table) -> list[str]:
    """The literals among ``texts`` that look like API names but have neither a target nor a listed reason."""
    return sorted(
        {t for t in texts if looks_like_api(t) and lookup(t, table) is None and spelling(t) not in table.unlinked}
    )


# --- the inventories ---------------------------------------------------------------------------------


def inventory_bytes(project: str, version: str, entries: Sequence[Api]) -> bytes:
    """A Sphinx inventory (format version 2: four header lines, then zlib-compressed object lines)."""
    header = f"# Sphinx inventory version 2\n# Project: {project}\n# Version: {version}\n"
    header += "# The remainder of this file is compressed using zlib.\n"
    lines = "".join(f"{api.name} {api.role} 1 {api.uri} -\n" for api in sorted(entries, key=lambda a: a.name))
    return header.encode() + zlib.compress(lines.encode(), 9)


def write_inventories(table: Table, folder: Path = INVENTORIES) -> list[Path]:
    """Write ``<project>.inv`` for each external project of ``table``; returns the files."""
    written = []
    for project in sorted(table.bases):
        entries = [api for api in table.entries if api.project == project]
        path = folder / f"{project}.inv"
        path.write_bytes(inventory_bytes(project, "stable", entries))
        written.append(path)
    return written


def intersphinx_mapping(table: Table | None = None, folder: Path = INVENTORIES) -> dict[str, tuple[str, str]]:
    """``conf.py``'s ``intersphinx_mapping``: each project's base URL with its committed inventory."""
    table = table or load_table()
    return {project: (base, str(folder / f"{project}.inv")) for project, base in table.bases.items()}


# --- GitHub links ------------------------------------------------------------------------------------


def extlinks(lightning: str | None = None, torch: str | None = None) -> dict[str, tuple[str, str]]:
    """``conf.py``'s ``extlinks``: issues, pull requests and files, files at the installed releases."""
    lightning = lightning or _version("lightning")
    torch = torch or _version("torch")
    pl, pt = "https://github.com/Lightning-AI/pytorch-lightning", "https://github.com/pytorch/pytorch"
    return {
        "lightning-issue": (f"{pl}/issues/%s", "Lightning #%s"),
        "lightning-pr": (f"{pl}/pull/%s", "Lightning pull request #%s"),
        "lightning-file": (f"{pl}/blob/{lightning}/src/%s", "%s"),
        "torch-issue": (f"{pt}/issues/%s", "PyTorch #%s"),
        "torch-pr": (f"{pt}/pull/%s", "PyTorch pull request #%s"),
        "torch-file": (f"{pt}/blob/v{torch}/%s", "%s"),
    }


def _version(distribution: str) -> str:
    """The installed release (local build tags such as ``+cpu`` dropped), or ``"main"`` when not installed."""
    try:
        return importlib.metadata.version(distribution).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return "main"


def _package_dir(name: str) -> Path | None:
    """Folder of an installed top-level package, found without importing it."""
    spec = importlib.util.find_spec(name)
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def upstream_file(text: str, roots: dict[str, Path | None]) -> tuple[str, str] | None:
    """``(role, path)`` of an upstream file a literal names, or None.

    ``torch/...`` is torch's; ``lightning/...`` and a path found under ``lightning/pytorch/`` (else
    ``lightning/fabric/``) of the installed Lightning are Lightning's, given relative to its ``src/``.
    """
    text = text.strip()
    if not re.fullmatch(r"[\w/]+\.py", text):
        return None
    torch, lightning = roots.get("torch"), roots.get("lightning")
    if text.startswith("torch/") and torch and (torch.parent / text).is_file():
        return "torch-file", text
    if lightning is None:
        return None
    for candidate in (text, f"lightning/pytorch/{text}", f"lightning/{text}", f"lightning/fabric/{text}"):
        if candidate.startswith("lightning/") and (lightning.parent / candidate).is_file():
            return "lightning-file", candidate
    return None


# --- the Sphinx side ---------------------------------------------------------------------------------


def _skip(node: nodes.Node) -> bool:
    """Inside a link, a code block or a notebook cell's output (tables the records fill)."""
    parent = node.parent
    while parent is not None:
        if isinstance(parent, (nodes.reference, nodes.FixedTextElement, nodes.title)):
            return True
        if parent.__class__.__name__ == "pending_xref":
            return True
        if isinstance(parent, nodes.Element) and "cell_output" in parent.get("classes", []):
            return True
        parent = parent.parent
    return False


def _extlink(app: Any, role: str, target: str, text: str) -> nodes.reference:
    url, _caption = app.config.extlinks[role]
    return nodes.reference(text, text, refuri=url % target, classes=["mpguide-extlink"])


def link_doctree(app: Any, doctree: nodes.document) -> None:
    """The three steps of the module docstring, on one page's doctree (``doctree-read``)."""
    from sphinx.addnodes import pending_xref
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    table = _table()
    docname = app.env.docname
    # the names are checked on the guide's own pages: the gallery's classes are the examples' own, and the API
    # reference's docstrings name internals (they link where a name is known, and are never flagged)
    checked = not docname.startswith("auto_examples/") and docname not in NAMES_UNCHECKED
    roots = {"torch": _package_dir("torch"), "lightning": _package_dir("lightning")}
    for literal in list(doctree.findall(nodes.literal)):
        if _skip(literal):
            continue
        text = literal.astext()
        api = lookup(text, table)
        if api is not None:
            # role "obj": the Python domain and intersphinx match it against every object type
            xref = pending_xref("", refdomain="py", reftype="obj", reftarget=api.name, refexplicit=True)
            literal["classes"].append("mpguide-api")  # UnlinkedApis finds it again if nothing resolved it
            literal.replace_self(xref)
            xref += literal
            continue
        found = upstream_file(text, roots) if docname not in FILE_LINK_SKIP else None
        if found is not None:
            link = _extlink(app, found[0], found[1], "")
            literal.replace_self(link)
            link += literal
            continue
        if checked and looks_like_api(text) and spelling(text) not in table.unlinked:
            logger.warning(
                f"[mpguide] ``{text}`` looks like a PyTorch or Lightning API name, but docs/_inventories/apis.toml "
                "has no target for it: add one, checked against its official page, or list it under [[unlinked]] "
                "with the reason",
                location=literal,
                type="mpguide",
                subtype="apilink",
            )
    for text_node in list(doctree.findall(nodes.Text)):
        if _skip(text_node) or isinstance(text_node.parent, nodes.literal) or "#" not in text_node:
            continue
        _link_citations(app, text_node)


def _link_citations(app: Any, text_node: nodes.Text) -> None:
    """Split one text node around its issue and pull-request citations, each citation a link."""
    text = str(text_node)
    parts: list[nodes.Node] = []
    end = 0
    for match in _CITATION.finditer(text):
        pytorch, lightning, number = match.groups()
        prefix = match.group(0).split(" #")[0]
        role = "torch-pr" if pytorch else "lightning-issue" if lightning or prefix == "issue" else "lightning-pr"
        parts.append(nodes.Text(text[end : match.start()]))
        parts.append(_extlink(app, role, number, match.group(0)))
        end = match.end()
    if parts:
        parts.append(nodes.Text(text[end:]))
        text_node.parent.replace(text_node, parts)


class UnlinkedApis(SphinxPostTransform):
    """After references are resolved: an API literal not inside a link had no target; warn, naming it."""

    default_priority = 20  # after ReferencesResolver (10)

    def run(self, **kwargs: Any) -> None:
        from sphinx.util import logging

        for literal in self.document.findall(nodes.literal):
            if "mpguide-api" in literal["classes"] and not isinstance(literal.parent, nodes.reference):
                api = lookup(literal.astext(), _table())
                logging.getLogger(__name__).warning(
                    f"[mpguide] ``{literal.astext()}``: docs/_inventories/apis.toml names {api.name if api else '?'}, "
                    "which neither the committed inventories nor this site's API reference has; rerun "
                    "`python -m mpguide_build.apilinks write` or fix the entry",
                    location=literal,
                    type="mpguide",
                    subtype="apilink",
                )


def setup(app: Any) -> dict[str, Any]:
    """Register the doctree step and the unresolved-reference warning (``conf.py`` lists the extension)."""
    app.connect("doctree-read", link_doctree)
    app.add_post_transform(UnlinkedApis)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def main(argv: Sequence[str] | None = None) -> int:
    """``write``: the inventories from ``apis.toml``; ``check``: exit 1 when the committed ones differ."""
    parser = argparse.ArgumentParser(prog="python -m mpguide_build.apilinks", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["write", "check"])
    args = parser.parse_args(argv)
    try:
        table = load_table()
    except TableError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.command == "write":
        for path in write_inventories(table):
            print(path)
        return 0
    stale = [
        p
        for p in sorted(table.bases)
        if (INVENTORIES / f"{p}.inv").read_bytes()
        != inventory_bytes(p, "stable", [a for a in table.entries if a.project == p])
    ]
    for project in stale:
        print(f"docs/_inventories/{project}.inv differs from apis.toml: python -m mpguide_build.apilinks write")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
