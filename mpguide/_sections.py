"""The guide's pitfall sections, by anchor, and the page's address (no imports: the claim gate reads them too)."""

#: The guide page, as a path from the site's root (``_build/html/`` after ``nox -s docs``, or the root of the
#: published site: the repository's GitHub Pages). The site has no fixed public address yet, so no host is
#: named. A finding of :class:`mpguide.checks.PitfallChecks` ends with ``GUIDE_URL + "#" + section``.
GUIDE_URL = "model/manual_optimization.html"
#: Every section a finding can name: the anchors of ``docs/model/manual_optimization.md``.
SECTIONS = (
    "no-gradient-step",
    "clipping",
    "scale-changes",
    "schedulers",
    "nonfinite-guard",
    "backward-flags",
    "fp16-parameters",
    "step-frequencies",
    "porting",
    "accumulation",
    "autocast-cache",
    "optimizer-math",
    "gradient-penalty",
)
