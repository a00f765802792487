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
#: Each section's heading on the guide page, so that a finding read in a terminal names what to look for
#: (``tests/test_checks.py`` holds them equal to the page's headings).
SECTION_TITLES = {
    "no-gradient-step": "Step only an optimizer that holds gradients",
    "clipping": "Gradient clipping",
    "scale-changes": "When the loss scale changes between two optimizers",
    "schedulers": "Learning-rate schedulers and skipped steps",
    "nonfinite-guard": 'The fp32 habit "skip the step if the gradient norm is not finite"',
    "backward-flags": "`loss.backward()` and the CPU fallback",
    "fp16-parameters": "Trainable fp16 parameters",
    "step-frequencies": "Different step frequencies",
    "porting": "Porting from automatic optimization",
    "accumulation": "Gradient accumulation",
    "autocast-cache": "Your own `torch.autocast` and the autocast cache",
    "optimizer-math": "Optimizers that multiply matrices in their step",
    "gradient-penalty": "Gradient penalties (`autograd.grad` inside `training_step`)",
}
