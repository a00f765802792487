"""What a reader does: take an example from the built site, install what the site says, run it.

The slow test follows the site's own words: the example page's install line and wheel link, the
``.py`` and ``.ipynb`` from its download links, an empty folder, a fresh virtual environment that
cannot see this repository, and the test preset. The fast tests keep the instruction identical
everywhere it is printed and prove the wheel is a valid archive.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mpguide_build import download

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "plot_05_skipped_steps"  # the quickest example at the test preset


def test_install_commands_are_printed_identically_everywhere():
    """Every example's header and the gallery's README carry the current wheel name and install commands."""
    places = sorted((ROOT / "examples").glob("plot_*.py")) + [ROOT / "examples" / "README.rst"]
    block = "".join(f"    {command}\n" for command in download.INSTALL_COMMANDS)  # an rst literal block
    for path in places:
        text = path.read_text()
        assert block in text, f"{path.name}: lacks the install commands {download.INSTALL_COMMANDS!r}"
        assert f"<../_static/{download.WHEEL_NAME}>`_" in text, f"{path.name}: lacks the wheel link"
        docstring = text.split('"""')[1] if path.suffix == ".py" else text
        assert block in docstring, f"{path.name}: install commands outside the header"


def test_install_commands_install_what_the_install_line_does_and_fit_a_phone():
    """The commands carry the one-line form's requirements and wheel, the wheel last, each within a phone's
    code width; a requirement too long for the width is refused with its length."""
    packages = [word for command in download.INSTALL_COMMANDS for word in command.split()[2:]]
    assert packages == download.INSTALL_LINE.split()[3:] + [download.WHEEL_NAME]
    assert all(command.startswith("pip install ") for command in download.INSTALL_COMMANDS)
    assert max(map(len, download.INSTALL_COMMANDS)) <= download.COMMAND_WIDTH
    with pytest.raises(ValueError, match="over 30"):
        download.install_commands(width=30)


def test_pages_link_the_current_wheel():
    for page in (ROOT / "docs" / "index.md", ROOT / "docs" / "model" / "manual_optimization.md"):
        text = page.read_text()
        assert f'_static/{download.WHEEL_NAME}">' in text, f"{page.name}: no link to {download.WHEEL_NAME}"
        assert download.INSTALL_LINE in text, f"{page.name}: lacks the install line"


def test_reader_requirements_are_the_pins_of_requirements_txt():
    pins = dict(
        line.split("#")[0].strip().split("==")
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if "==" in line.split("#")[0]
    )
    for requirement in download.READER_REQUIREMENTS:
        name, version = requirement.split("==")
        assert pins.get(name) == version, f"{requirement} differs from requirements.txt ({pins.get(name)})"


def test_wheel_is_a_complete_reproducible_archive(tmp_path):
    first = download.write_wheel(tmp_path / "a")
    second = download.write_wheel(tmp_path / "b")
    assert first.name == download.WHEEL_NAME
    assert first.read_bytes() == second.read_bytes(), "the same sources must give the same wheel"
    with zipfile.ZipFile(first) as archive:
        names = set(archive.namelist())
        record = archive.read(f"mpguide-{download.__version__}.dist-info/RECORD").decode()
    sources = {
        f"mpguide/{p.relative_to(ROOT / 'mpguide').as_posix()}"
        for p in (ROOT / "mpguide").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert sources <= names, f"missing from the wheel: {sorted(sources - names)}"
    assert "mpguide/verify/run/runner.py" in names, "the examples' harness ships with the reader API"
    python = [n for n in names if n.endswith(".py")]
    assert not [n for n in python if not n.startswith("mpguide/")], "only the package, never the build code"
    assert not [n for n in python if n.rsplit("/", 1)[-1] in ("summary_schema.py", "pages.py")], "build code stays out"
    sphinx_users = [n for n in python if b"sphinx" in archive_bytes(first, n) or b"docutils" in archive_bytes(first, n)]
    assert not [
        n
        for n in sphinx_users
        if b"import sphinx" in archive_bytes(first, n)
        or b"from sphinx" in archive_bytes(first, n)
        or b"docutils" in archive_bytes(first, n)
    ], sphinx_users
    listed = {line.split(",")[0] for line in record.splitlines()}
    assert listed == names, f"RECORD and archive differ: {sorted(listed ^ names)}"


def archive_bytes(wheel, name: str) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(name)


def test_wheel_refuses_a_folder_that_is_not_the_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="no __init__.py"):
        download.wheel_files(tmp_path)


def _page_instruction(page: Path) -> tuple[list[str], Path, Path, Path]:
    """The install commands, the wheel, the .py and the .ipynb, as the example page links them."""
    text = page.read_text()
    plain = html.unescape(re.sub(r"<[^>]+>", "", text))
    lines = [line.strip() for line in plain.splitlines() if line.strip().startswith("pip install ")]
    assert lines, f"{page}: no 'pip install' line on the page"
    hrefs = [html.unescape(h) for h in re.findall(r'href="([^"#]+)"', text)]

    def linked(suffix: str) -> Path:
        found = [h for h in hrefs if h.endswith(suffix)]
        assert found, f"{page}: no link to a *{suffix}"
        path = (page.parent / found[0]).resolve()
        assert path.is_file(), f"{page}: link {found[0]} points to nothing"
        return path

    return lines, linked(".whl"), linked(f"{EXAMPLE}.py"), linked(f"{EXAMPLE}.ipynb")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} (in {cwd}) failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc


@pytest.mark.slow
@pytest.mark.build
def test_downloaded_example_runs_after_the_sites_install_commands(built_site, tmp_path):
    out, _ = built_site
    commands, wheel, script, notebook = _page_instruction(out / "html" / "auto_examples" / f"{EXAMPLE}.html")
    assert tuple(commands) == download.INSTALL_COMMANDS
    folder, nb_folder = tmp_path / "reader", tmp_path / "reader-notebook"
    folder.mkdir()
    nb_folder.mkdir()
    for source, target in ((wheel, folder), (script, folder), (notebook, nb_folder)):
        shutil.copy(source, target / source.name)

    # a fresh venv, outside the repository, with no PYTHONPATH and no mpguide settings
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("MPGUIDE_")}
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    python = str(venv / "bin" / "python")
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv))
    _run([python, "-m", "pip", "install", "-q", "torch==2.13.0"], folder, env)
    for command in commands:  # exactly the page's commands ("pip install ..."), in order
        _run([python, "-m", *command.split()], folder, env)
    where = _run([python, "-c", "import mpguide; print(mpguide.__file__)"], folder, env).stdout.strip()
    assert Path(where).is_relative_to(venv), f"mpguide came from {where}, not from the installed wheel"

    env["MPGUIDE_PRESET"] = "test"
    ran = _run([python, script.name], folder, env).stdout
    # the script path (tests/test_examples.py judges the examples in the build): the printed verdict table's
    # count line, the record's path relative to the working folder, the figures saved next to the record
    counts = re.search(r"\b(\d+) of (\d+) checks in the table hold(?:, (\d+) inconclusive)?", ran)
    assert counts and int(counts[1]) + int(counts[3] or 0) == int(counts[2]), ran[-2000:]
    assert f"results saved to {Path('results', 'local', EXAMPLE + '.json')}" in ran, ran[-2000:]
    assert list((folder / "results" / "local").glob(f"{EXAMPLE}_*.png")), "no figures next to the record"
    _run([python, "-m", "mpguide.verify.gate", str(folder / "results" / "local")], folder, env)

    _run([python, "-m", "pip", "install", "-q", "nbclient", "ipykernel"], folder, env)
    execute = (
        "import nbclient, nbformat, sys; nb = nbformat.read(sys.argv[1], as_version=4); "
        "nbclient.NotebookClient(nb, timeout=900, kernel_name='python3', "
        "resources={'metadata': {'path': '.'}}).execute()"
    )
    _run([python, "-c", execute, notebook.name], nb_folder, env)
    _run([python, "-m", "mpguide.verify.gate", str(nb_folder / "results" / "local")], nb_folder, env)


def test_page_instruction_fails_without_install_line_or_wheel(tmp_path):
    """The reader test's page parser refuses a page that lacks the line, or links a wheel that is not there."""
    page = tmp_path / "auto_examples" / f"{EXAMPLE}.html"
    page.parent.mkdir()
    page.write_text("<p>no instruction here</p>")
    with pytest.raises(AssertionError, match="no 'pip install' line"):
        _page_instruction(page)
    commands = "\n".join(download.INSTALL_COMMANDS)
    page.write_text(f'<pre>{commands}</pre><a href="../_static/{download.WHEEL_NAME}">wheel</a>')
    with pytest.raises(AssertionError, match="points to nothing"):
        _page_instruction(page)


#: The Lightning release the PitfallChecks install test starts from: older than the site's, one where the
#: matrix's PitfallChecks claims on stock runs hold (results/matrix/lightning-2.5.5.json).
OLDER_LIGHTNING = "2.5.5"

CHECKS_PROGRAM = """
import lightning, torch
from lightning.pytorch import LightningModule, Trainer
from mpguide.checks import PitfallChecks

class Cut(LightningModule):  # optimizer 1's loss reaches none of its parameters
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.a, self.b = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        opt_a, opt_b = self.optimizers()
        loss = self.a(batch[0]).pow(2).mean()
        for opt in (opt_a, opt_b):
            opt.zero_grad()
        self.manual_backward(loss)
        opt_a.step()
        opt_b.step()
    def configure_optimizers(self):
        return torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.1)

data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=8)
checks = PitfallChecks()
Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, callbacks=[checks],
        enable_model_summary=False).fit(Cut(), data)
print("lightning", lightning.__version__)
print("sections", sorted({f.section for f in checks.findings}))
"""


def test_checks_install_line_pins_nothing():
    """The PitfallChecks line installs no dependency and replaces an older copy; the wheel pins nothing exactly."""
    assert download.CHECKS_INSTALL_LINE.split()[:4] == ["pip", "install", "--force-reinstall", "--no-deps"]
    assert "==" not in download.CHECKS_INSTALL_LINE
    assert not any("==" in r for r in download.WHEEL_REQUIREMENTS)
    for page in (ROOT / "docs" / "index.md", ROOT / "docs" / "model" / "manual_optimization.md"):
        assert download.CHECKS_INSTALL_LINE in page.read_text(), f"{page.name}: lacks {download.CHECKS_INSTALL_LINE}"


@pytest.mark.slow
def test_checks_install_keeps_the_readers_lightning(tmp_path):
    """A fresh venv with an older Lightning: the PitfallChecks line keeps its version, and a fit reports a finding.

    torch comes first (the workplace's local CPU wheel when pip finds one), then Lightning, then the line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "MPGUIDE_", "VIRTUAL_ENV"))}
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet"]
    _run([*pip, "torch==2.13.0"], tmp_path, env)
    _run([*pip, f"lightning=={OLDER_LIGHTNING}"], tmp_path, env)
    download.write_wheel(tmp_path)
    old = download.write_wheel(tmp_path / "old")  # an older copy of the same version, installed first
    _run([*pip, "--no-deps", str(old)], tmp_path, env)
    site = Path(
        _run(
            [python, "-c", "import mpguide, pathlib; print(pathlib.Path(mpguide.__file__).parent)"], tmp_path, env
        ).stdout.strip()
    )
    (site / "checks" / "__init__.py").write_text("raise ImportError('the older copy')\n")
    _run([python, "-m", "pip", *download.CHECKS_INSTALL_LINE.split()[1:]], tmp_path, env)
    (tmp_path / "fit.py").write_text(CHECKS_PROGRAM)
    out = _run([python, "fit.py"], tmp_path, env).stdout
    assert f"lightning {OLDER_LIGHTNING}" in out, out
    assert "no-gradient-step" in out, out


def test_checks_releases_are_where_the_matrix_pitfallchecks_claims_hold():
    """Every release the pages name for PitfallChecks: all its PitfallChecks claims on stock runs pass."""
    import json

    for release in download.CHECKS_RELEASES:
        column = json.loads((ROOT / "results" / "matrix" / f"lightning-{release}.json").read_text())
        claims = [
            c
            for example in column["examples"].values()
            for c in example.get("claims", [])
            if c["kind"] in ("clean", "flags") and not any("plugin" in run for run in c["runs"])
        ]
        assert claims, f"lightning-{release}.json: no PitfallChecks claim"
        # a claim declared only_if a measured condition the release does not meet is neither held nor failed there
        failed = [c["title"] for c in claims if c["verdict"] not in ("pass", "not applicable")]
        assert not failed, f"lightning {release}: PitfallChecks claims that do not hold: {failed}"
