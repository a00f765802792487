"""How well a build overlaps its work: wall time over the summed execution it had to do.

A clean build executes every gallery example (sphinx-gallery, in ``parallel`` worker processes)
and every notebook page (MyST-NB, one Jupyter kernel per page; with ``sphinx-build -j N`` the pages
are read in N processes). Their summed execution time is the work; the build's wall time is what
a writer waits. On a machine with ``c`` cores a build that overlapped everything perfectly would
reach a ratio of ``1 / c`` (0.5 on 2 cores); a build that runs everything one after the other
reaches about 1. The ratio is printed, never judged: a busy machine slows numerator and
denominator alike, so it is a measurement to record (README, budget table), not a test that could
fail because the machine was busy.

Sources: the examples' times come from sphinx-gallery's JUnit XML (configuration value
``junit``, written by ``sphinx_gallery.gen_gallery.write_junit_xml`` at ``build-finished``; one
``<testcase time="seconds">`` per example executed in this build); the pages' times from MyST-NB's
execution data (``NbMetadataCollector.get_doc_data(env)[docname]["exec_data"]["runtime"]``,
seconds, set only for pages executed in this build).
"""

from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: When the extension was imported (``time.monotonic()``, seconds): the start of the measured wall
#: time. Sphinx imports extensions within about a second of its own start.
STARTED = time.monotonic()


@dataclass(frozen=True)
class BuildTime:
    """One build's wall time and the execution it overlapped (all in seconds).

    Attributes:
        wall_s: wall time from the extension's import to the end of the build.
        examples_s: seconds of every example executed in this build, summed.
        examples: how many examples executed.
        pages_s: seconds of every notebook page executed in this build, summed.
        pages: how many notebook pages executed.
        cores: ``os.cpu_count()`` of the machine.
    """

    wall_s: float
    examples_s: float
    examples: int
    pages_s: float
    pages: int
    cores: int

    @property
    def ratio(self) -> float | None:
        """``wall_s / (examples_s + pages_s)``; ``None`` when nothing executed (a cached rebuild)."""
        work = self.examples_s + self.pages_s
        return self.wall_s / work if work > 0 else None

    def line(self) -> str:
        """The one line the build prints."""
        head = (
            f"build time: {self.wall_s:.1f} s wall; {self.examples} example(s) executed, {self.examples_s:.1f} s "
            f"summed; {self.pages} page(s) executed, {self.pages_s:.1f} s summed"
        )
        if self.ratio is None:
            return head + "; nothing executed, so no overlap ratio"
        return (
            f"{head}; wall / (examples + pages) = {self.ratio:.2f} on {self.cores} core(s) "
            f"(perfect overlap: {1 / self.cores:.2f})"
        )


def example_times(junit_xml: Path) -> list[tuple[str, float]]:
    """``(example stem, seconds)`` of each example a sphinx-gallery JUnit file lists.

    Args:
        junit_xml: the file sphinx-gallery wrote (``<outdir>/<junit>``).

    Raises:
        ValueError: the file is not JUnit XML as sphinx-gallery writes it (the message names it).
    """
    try:
        root = ET.parse(junit_xml).getroot()
        return [(case.attrib["classname"], float(case.attrib["time"])) for case in root.iter("testcase")]
    except (ET.ParseError, KeyError, ValueError) as err:
        raise ValueError(
            f"{junit_xml}: not sphinx-gallery's JUnit XML ({err}); delete it and rebuild with a clean tree"
        ) from None


def page_times(nb_data: dict[str, Any]) -> list[tuple[str, float]]:
    """``(docname, seconds)`` of each notebook page MyST-NB executed in this build."""
    out = []
    for docname, data in sorted(nb_data.items()):
        exec_data = data.get("exec_data") or {}
        if exec_data.get("method") != "cache" and isinstance(exec_data.get("runtime"), int | float):
            out.append((docname, float(exec_data["runtime"])))
    return out


def measure(app: Any) -> BuildTime:
    """This build's :class:`BuildTime` (call at ``build-finished``, after sphinx-gallery wrote its JUnit file)."""
    try:  # a site without sphinx-gallery (or without MyST-NB) has nothing of that kind to count
        junit = app.config.sphinx_gallery_conf.get("junit")
    except AttributeError:
        junit = None
    path = Path(app.builder.outdir, junit) if junit else None
    examples = [(name, t) for name, t in example_times(path) if t > 0] if path is not None and path.is_file() else []
    try:
        from myst_nb.sphinx_ import NbMetadataCollector
    except ImportError:
        pages = []
    else:
        pages = page_times(NbMetadataCollector.get_doc_data(app.env))
    return BuildTime(
        wall_s=time.monotonic() - STARTED,
        examples_s=sum(t for _, t in examples),
        examples=len(examples),
        pages_s=sum(t for _, t in pages),
        pages=len(pages),
        cores=os.cpu_count() or 1,
    )
