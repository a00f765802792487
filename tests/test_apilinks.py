"""Links into the ecosystem (mpguide_build.apilinks): every API name of the guide has an official target,
the committed inventories are the table's, and a real Sphinx build links names, citations and files."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

from mpguide_build import apilinks

#: The guide's own pages (the gallery's classes are the examples' own; the API reference names internals).
GUIDE_PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "auto_examples" not in p.parts)
_FENCE = re.compile(r"^(```|~~~|:::).*?^\1", re.S | re.M)
_INLINE = re.compile(r"(?<![`}])`([^`\n]+)`(?!`)")  # not a role's content ({glue:text}`x`, {py:class}`x`)


def inline_code(path: Path) -> list[str]:
    """The inline code literals of a MyST page, fenced blocks and role contents left out."""
    return _INLINE.findall(_FENCE.sub("", path.read_text(encoding="utf-8")))


def test_every_api_name_on_the_guide_has_a_target():
    table = apilinks.load_table()
    names = [text for page in GUIDE_PAGES for text in inline_code(page)]
    assert len(names) > 100, "the scan found the guide's inline code"
    unlinked = apilinks.unlinked_names(names, table)
    assert unlinked == [], (
        f"API names on the guide without a target: {unlinked}; add each to docs/_inventories/apis.toml, checked "
        "against its official page (then python -m mpguide_build.apilinks write), or list it under [[unlinked]]"
    )
    linked = {apilinks.lookup(t, table).name for t in names if apilinks.lookup(t, table)}
    for name in ("torch.amp.GradScaler", "torch.autocast", "lightning.pytorch.core.LightningModule.manual_backward"):
        assert name in linked, f"the guide no longer names {name}? (the scan or the table broke)"


def test_the_check_fails_on_a_made_up_name():
    table = apilinks.load_table()
    texts = ["torch.amp.MadeUpScaler", "self.made_up_hook(loss)", "MadeUpPrecision", "GradScaler", "zero_grad"]
    assert apilinks.unlinked_names(texts, table) == [
        "MadeUpPrecision",
        "self.made_up_hook(loss)",
        "torch.amp.MadeUpScaler",
    ]
    # not API names: settings, messages, builtins, chains through attributes
    for text in ('precision="16-mixed"', "AssertionError", "RuntimeError: x", "self.trainer.precision_plugin.scaler"):
        assert not apilinks.looks_like_api(text), text


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("GradScaler", "torch.amp.GradScaler"),
        ("self.manual_backward(loss)", "lightning.pytorch.core.LightningModule.manual_backward"),
        ("torch.autocast(self.device.type, enabled=False)", "torch.autocast"),
        ("on_before_optimizer_step", "lightning.pytorch.core.hooks.ModelHooks.on_before_optimizer_step"),
        ("opt.toggle_model()", "lightning.pytorch.core.optimizer.LightningOptimizer.toggle_model"),
        ("self.clip_gradients(opt, ...)", "lightning.pytorch.core.LightningModule.clip_gradients"),
        ("MixedPrecision", "lightning.pytorch.plugins.precision.MixedPrecision"),
        ("Trainer", "lightning.pytorch.trainer.trainer.Trainer"),
        ("torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_norm_"),
        ("ManualMixedPrecision", "mpguide.precision.ManualMixedPrecision"),
    ],
)
def test_spellings_name_their_object(text, name):
    assert apilinks.lookup(text, apilinks.load_table()).name == name


def test_every_external_entry_says_where_it_was_checked_and_project_entries_exist():
    import importlib

    table = apilinks.load_table()
    for api in table.entries:
        if api.project == "mpguide":
            module, _, attr = api.name.rpartition(".")
            assert hasattr(importlib.import_module(module), attr), f"{api.name} is not in the library"
        else:
            assert api.checked and api.uri, api.name
            assert api.role in ("py:class", "py:method", "py:function", "py:property"), api


def test_committed_inventories_are_the_tables_and_sphinx_reads_them(tmp_path):
    from sphinx.util.inventory import InventoryFile

    assert apilinks.main(["check"]) == 0, "python -m mpguide_build.apilinks write"
    table = apilinks.load_table()
    inventory = InventoryFile.loads((apilinks.INVENTORIES / "torch.inv").read_bytes(), uri=table.bases["torch"])
    item = inventory.data["py:class"]["torch.autocast"]
    assert item.uri == "https://docs.pytorch.org/docs/stable/amp.html#torch.autocast"
    # the check fails when the table changes and the inventories are not rewritten
    other = apilinks.Table(table.bases, table.spellings, table.unlinked, table.entries[1:])
    entries = [a for a in other.entries if a.project == "torch"]
    assert apilinks.inventory_bytes("torch", "stable", entries) != (apilinks.INVENTORIES / "torch.inv").read_bytes()


def test_a_malformed_table_is_one_clear_error(tmp_path):
    bad = tmp_path / "apis.toml"
    bad.write_text('[projects.torch]\nbase = "x"\n[[api]]\nname = "torch.x"\nproject = "torch"\nrole = "py:class"\n')
    with pytest.raises(apilinks.TableError, match=r"api entry 0 \(torch.x\) lacks \['spellings', 'uri', 'checked'\]"):
        apilinks.load_table(bad)


def test_citations_and_files(tmp_path):
    roots = {"torch": apilinks._package_dir("torch"), "lightning": apilinks._package_dir("lightning")}
    assert apilinks.upstream_file("plugins/precision/amp.py", roots) == (
        "lightning-file",
        "lightning/pytorch/plugins/precision/amp.py",
    )
    assert (
        apilinks.upstream_file("fabric/plugins/precision/amp.py", roots)[1]
        == "lightning/fabric/plugins/precision/amp.py"
    )
    assert apilinks.upstream_file("torch/amp/grad_scaler.py", roots) == ("torch-file", "torch/amp/grad_scaler.py")
    assert apilinks.upstream_file("plugins/precision/no_such_file.py", roots) is None
    links = apilinks.extlinks("2.6.6", "2.13.0")
    assert links["lightning-file"][0] % "lightning/pytorch/core/module.py" == (
        "https://github.com/Lightning-AI/pytorch-lightning/blob/2.6.6/src/lightning/pytorch/core/module.py"
    )
    assert links["torch-file"][0] % "torch/amp/grad_scaler.py" == (
        "https://github.com/pytorch/pytorch/blob/v2.13.0/torch/amp/grad_scaler.py"
    )


def _build(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(ROOT / "docs" / "_ext")!r})
            from mpguide_build import apilinks
            extensions = ["sphinx.ext.intersphinx", "sphinx.ext.extlinks", "mpguide_build.apilinks"]
            intersphinx_mapping = apilinks.intersphinx_mapping()
            extlinks = apilinks.extlinks()
            nitpicky = True
            """
        )
    )
    (src / "index.rst").write_text("Page\n====\n\n" + body + "\n")
    cmd = [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(src), str(tmp_path / "html")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_a_build_links_names_citations_and_files(tmp_path):
    body = (
        "Call ``self.manual_backward(loss)``, clip in ``on_before_optimizer_step`` (``GradScaler``), as in "
        "Lightning #12600 and PyTorch pull request #165068; see ``plugins/precision/amp.py``. Roles for writers: "
        ":lightning-pr:`21436`, :torch-file:`torch/amp/grad_scaler.py`."
    )
    proc = _build(tmp_path, body)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "html" / "index.html").read_text()
    for url in (
        "https://lightning.ai/docs/pytorch/stable/optional-api/api/lightning.pytorch.core.LightningModule"
        "#lightning.pytorch.core.LightningModule.manual_backward",
        "https://lightning.ai/docs/pytorch/stable/optional-api/api/lightning.pytorch.core.hooks.ModelHooks"
        "#lightning.pytorch.core.hooks.ModelHooks.on_before_optimizer_step",
        "https://docs.pytorch.org/docs/stable/amp.html#gradient-scaling",
        "https://github.com/Lightning-AI/pytorch-lightning/issues/12600",
        "https://github.com/pytorch/pytorch/pull/165068",
        "https://github.com/Lightning-AI/pytorch-lightning/blob/",
        "https://github.com/Lightning-AI/pytorch-lightning/pull/21436",
        f"https://github.com/pytorch/pytorch/blob/v{apilinks._version('torch')}/torch/amp/grad_scaler.py",
    ):
        assert f'href="{url}' in page, url


def test_a_build_fails_on_a_made_up_api_name(tmp_path):
    proc = _build(tmp_path, "Step with ``torch.amp.MadeUpScaler`` here.")
    assert proc.returncode != 0
    assert "``torch.amp.MadeUpScaler`` looks like a PyTorch or Lightning API name" in proc.stderr, proc.stderr
