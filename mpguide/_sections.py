"""The guide's pitfall sections, by anchor, and the page's address (no imports: the claim gate reads them too)."""

#: The guide page; a finding of :class:`mpguide.checks.PitfallChecks` links to ``GUIDE_URL + "#" + section``.
GUIDE_URL = "https://mpguide.readthedocs.io/en/latest/model/manual_optimization.html"
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
