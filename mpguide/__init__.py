"""Helper library of the verified guide to manual optimization under mixed precision.

Modules, one concern each: :mod:`~mpguide.hardware` (device, precision, presets),
:mod:`~mpguide.data` (bundled digits data), :mod:`~mpguide.runner` (real Trainer runs),
:mod:`~mpguide.records` (results records), :mod:`~mpguide.claims` (claims and thresholds),
:mod:`~mpguide.gate` (the claim gate and its CLI), :mod:`~mpguide.plotting` and
:mod:`~mpguide.report` (figures and tables), :mod:`~mpguide.sphinx_ext` (the Sphinx extension).
"""

__version__ = "0.1.0"
