"""What a reader's own code imports: precision plugins for manual optimization, step helpers, and the small
demo models and bundled data the examples subclass.

:mod:`~mpguide.precision` (:class:`~mpguide.precision.ManualMixedPrecision`, the Trainer plugin),
:mod:`~mpguide.fabric` (:class:`~mpguide.fabric.FabricManualMixedPrecision`), :mod:`~mpguide.steps`
(skip-aware stepping, loss-scale helpers), :mod:`~mpguide.models` and :mod:`~mpguide.data`; the two plugins
share their bookkeeping and warning class through :mod:`~mpguide._common`. This layer
depends on torch and Lightning only. The examples verify themselves with :mod:`mpguide.verify`; the
docs build's own code lives outside the package, in ``docs/_ext/mpguide_build``.
"""

__version__ = "0.1.0"
