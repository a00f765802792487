"""Sphinx configuration. Sources live in docs/; build with ``nox -s docs`` (see README.md).

sphinx-build -c . docs _build/html   (the nox sessions pass the right flags)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).parent.resolve()
DOCS = ROOT / "docs"
# The build's own code (the extension, page check, references, matrix, download) lives outside the installed
# package, as sphinx-gallery and scikit-learn keep theirs; the page kernels and gallery workers import it too.
sys.path.insert(0, str(DOCS / "_ext"))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(DOCS / "_ext"), os.environ.get("PYTHONPATH")) if p)

project = "Manual optimization under mixed precision"
author = "The mpguide authors"
copyright = "2026, the mpguide authors"

extensions = [
    "myst_nb",
    "sphinx_gallery.gen_gallery",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_copybutton",
    "sphinx.ext.extlinks",
    "sphinx.ext.intersphinx",
    "mpguide_build.sphinx_ext",
    "mpguide_build.apilinks",
]

exclude_patterns = [
    "_build",
    "jupyter_execute",
    # sphinx-gallery writes a notebook and a copy of each script next to its page; MyST-NB would
    # try to read them as documents of their own.
    "auto_examples/*.ipynb",
    "auto_examples/*.py",
    "auto_examples/*.zip",
    "**/*.md5",
]

# --- mpguide: where records live, which pages read them, whether the claim gate runs -------
mpguide_results_dir = os.environ.get("MPGUIDE_RESULTS_DIR", str(ROOT / "_build" / "results"))
mpguide_reference_dir = str(ROOT / "results" / "reference")
mpguide_examples_dir = str(ROOT / "examples")
mpguide_gallery_dir = str(DOCS / "auto_examples")
mpguide_record_pages = ["index", "model/manual_optimization", "verification", "gpu_references"]
mpguide_matrix_pages = ["index", "model/manual_optimization", "releases"]  # they quote results/matrix/*.json
mpguide_gate = True  # the preview session passes -D mpguide_gate=0 (nothing runs, nothing is judged)
os.environ["MPGUIDE_RESULTS_DIR"] = mpguide_results_dir  # the MyST-NB kernel inherits it

# --- sphinx-gallery: runs every examples/plot_*.py at builder start ---------------------------
# Examples are independent (each trains its own runs and writes its own record), so they run in
# parallel worker processes (joblib's loky backend), one per core; the workers start after
# mpguide_build.sphinx_ext exported MPGUIDE_RESULTS_DIR and inherit it. MPGUIDE_GALLERY_JOBS=1 runs them
# one after the other in the Sphinx process; any other number sets the workers.
os.environ["MPGUIDE_IN_GALLERY"] = "1"  # report.verdicts(): the page renders the table, so it is not printed too
gallery_jobs = int(os.environ.get("MPGUIDE_GALLERY_JOBS") or os.cpu_count() or 1)
sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": str(DOCS / "auto_examples"),
    # MPGUIDE_GALLERY_ONLY="plot_07" executes only the matching examples (a writer measuring one page);
    # the others render without output, and the gate judges whatever records the results folder holds
    "filename_pattern": "/" + (os.environ.get("MPGUIDE_GALLERY_ONLY") or "plot_"),
    "abort_on_example_error": True,
    "download_all_examples": True,
    "remove_config_comments": True,
    "min_reported_time": 0,
    "capture_repr": (
        "_repr_html_",
    ),  # the verdict table an example ends with (mpguide.verify.show.report.VerdictTable)
    "matplotlib_animations": False,
    "show_memory": False,
    # each executed example's seconds, read by mpguide_build.buildtime for the build-time line
    "junit": os.path.join("..", "sphinx-gallery-junit.xml"),
    "parallel": gallery_jobs if gallery_jobs > 1 else False,
    # matplotlib's reset, and on a GPU every Trainer.fit holds a shared device lock so that plot_15's
    # benchmark, which takes it exclusively, times an otherwise idle GPU (a string: workers import it)
    # and each parallel worker gets its share of the cores (torch would start one thread per core in each)
    "reset_modules": (
        "matplotlib",
        "mpguide_build.sphinx_ext.share_device_in_fits",
        "mpguide_build.sphinx_ext.threads_per_worker",
    ),
    # the file names' order (plot_01 ... plot_08), not sphinx-gallery's default (code size); a string,
    # because a function object in the configuration breaks the environment cache
    "within_subsection_order": "FileNameSortKey",
}

# --- MyST-NB: the guide page executes its cells to read the records ---------------------------
# "force": jupyter-cache keys on code, not on data, so a cached page would show old records.
nb_execution_mode = "force"
nb_execution_timeout = 180
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
nb_render_markdown_format = "myst"  # Markdown outputs (verdict tables) use MyST, which has tables
myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3

# --- links into the ecosystem (mpguide_build.apilinks) ------------------------------------------
# API names link to PyTorch's and Lightning's official pages through inventories committed under
# docs/_inventories/ (no network at build time; each target checked against the official page, see
# apis.toml); issues, pull requests and upstream files link to GitHub, files at the installed releases.
from mpguide_build import apilinks  # noqa: E402

intersphinx_mapping = apilinks.intersphinx_mapping()
intersphinx_cache_limit = 0
extlinks = apilinks.extlinks()
extlinks_detect_hardcoded_links = False

# --- nitpicky references -------------------------------------------------------------------
# Every reference inside this project must resolve (the strict build runs with -n). Inventories of
# Python, NumPy, PyTorch, Lightning, scikit-learn and Sphinx cannot be fetched on the machines that
# build this site (no network beyond package registries): the PyTorch and Lightning names the guide uses
# link through the small committed inventories above (mpguide_build.apilinks warns on a name it cannot
# link); other references into those projects render as plain text, and only those are exempt.
nitpicky = True
nitpick_ignore_regex = [
    # the pydantic models of the record and summary schemas render as field reprs, not as API; read in the source
    (r"py:.*", r"(mpguide\.verify\.records\.|mpguide_build\.summary_)schema(\..*)?|Record"),
    (
        r"py:.*",
        r"(ast|time|docutils|pathlib|json|os|numpy|np|torch|lightning|sklearn|sphinx|matplotlib|typing|collections|warnings)(\..*)?",
    ),
    (
        r"py:(class|exc)",
        r"(Path|Any|Callable|Sequence|Iterable|Generator|Literal|Optimizer|Tensor|MisconfigurationException)",
    ),
]

# --- autodoc ------------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True

# --- HTML -----------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "Manual optimization under mixed precision"
html_short_title = "mpguide"
# one-page sections: no left nav; an example page gives its width to code formatted at 120 columns (mpguide.css)
html_sidebars = {
    **dict.fromkeys(["index", "model/manual_optimization", "api", "releases", "verification"], []),
    "auto_examples/plot_*": [],
}
html_theme_options = {
    "logo": {"text": "mpguide"},
    "header_links_before_dropdown": 3,
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_static_path = [str(DOCS / "_static")]
html_favicon = str(DOCS / "_static" / "favicon.png")
html_css_files = ["mpguide.css"]  # code scrolls sideways, wide tables show a scroll hint, compact page TOC
html_js_files = ["mpguide.js"]  # figures enlarge on click/tap, wide-table hint, the page TOC follows the reader
html_search_scorer = str(DOCS / "_search" / "scorer.js")  # the guide answers first, then examples (by role)
html_scaled_image_link = False  # a figure shrunk with :width: enlarges in place (mpguide.js), no link away
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
copybutton_exclude = ".linenos, .gp, .go"


def setup(app):
    """Publish the helper library's wheel with the site (``_static/``), where every example links it."""
    from mpguide_build.download import publish_wheel

    app.connect("build-finished", publish_wheel)
