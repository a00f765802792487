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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: When the extension was imported (``time.monotonic()``, seconds): the start of the measured wall
#: time. Sphinx imports extensions within about a second of its own start.
STARTED = time.monotonic()

#: The build's phases in order, each ended by a Sphinx event the extension marks (:func:`mark`):
#: the gallery (``builder-inited`` after sphinx-gallery ran its examples), reading (``env-updated``:
#: every page parsed, the notebook pages executed), writing (``build-finished``, first handler), and
#: finishing (the gate, the page check, the JUnit file: the build's last handler).
PHASES = ("gallery", "reading", "writing", "finishing")

_MARKS: dict[str, float] = {}

#: The documents Sphinx reads in this build (``env-before-read-docs``); a page's execution data
#: stays in the environment after the build that executed it, so only these count.
_READ: set[str] = set()


def reading(docnames: list[str]) -> None:
    """Note the documents this build reads (call at ``env-before-read-docs``, once per build: a second build in
    the same process counts only its own)."""
    _READ.clear()
    _READ.update(docnames)


def mark(phase: str) -> None:
    """Note that ``phase`` (one of :data:`PHASES`) ended now; a later mark of the same phase wins."""
    if phase not in PHASES:
        raise ValueError(f"unknown build phase {phase!r}; one of {', '.join(PHASES)}")
    _MARKS[phase] = time.monotonic()


def phase_seconds(marks: dict[str, float], started: float) -> dict[str, float]:
    """Seconds of each phase that has an end mark, from the previous mark (or ``started``), in order.

    A phase without a mark (a build that stopped before it) is left out, and the next phase counts from the
    last mark before it.
    """
    out, last = {}, started
    for phase in PHASES:
        if phase in marks:
            out[phase] = max(0.0, marks[phase] - last)
            last = marks[phase]
    return out


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
        phases: seconds of each marked phase (:data:`PHASES`), in order.
    """

    wall_s: float
    examples_s: float
    examples: int
    pages_s: float
    pages: int
    cores: int
    phases: dict[str, float] = field(default_factory=dict)

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
        phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.phases.items())
        tail = f"; phases: {phases}" if phases else ""
        if self.ratio is None:
            return head + "; nothing executed, so no overlap ratio" + tail
        return (
            f"{head}; wall / (examples + pages) = {self.ratio:.2f} on {self.cores} core(s) "
            f"(perfect overlap: {1 / self.cores:.2f})" + tail
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


def page_times(nb_data: dict[str, Any], read: set[str] | None = None) -> list[tuple[str, float]]:
    """``(docname, seconds)`` of each notebook page MyST-NB executed in this build.

    ``read``: the documents this build read; a page outside it keeps the execution data of the build that
    executed it and is left out. ``None`` counts every page with execution data.
    """
    out = []
    for docname, data in sorted(nb_data.items()):
        if read is not None and docname not in read:
            continue
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
        pages = page_times(NbMetadataCollector.get_doc_data(app.env), _READ)
    mark("finishing")
    return BuildTime(
        wall_s=_MARKS["finishing"] - STARTED,
        examples_s=sum(t for _, t in examples),
        examples=len(examples),
        pages_s=sum(t for _, t in pages),
        pages=len(pages),
        cores=os.cpu_count() or 1,
        phases=phase_seconds(_MARKS, STARTED),
    )
