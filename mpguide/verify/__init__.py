"""What an example runs to verify itself: real Trainer and Fabric runs, records, claims and the claim gate.

This layer depends on the reader API (:mod:`mpguide.precision`, :mod:`mpguide.fabric`, :mod:`mpguide.steps`,
:mod:`mpguide.models`, :mod:`mpguide.data`), on torch and Lightning, never on Sphinx. Modules, one concern
each: :mod:`~mpguide.verify.hardware` (device, precision, presets), :mod:`~mpguide.verify.claims.declarations`
(the RUNS/CLAIMS tables of an example), :mod:`~mpguide.verify.run.runner` (an example's runs),
:mod:`~mpguide.verify.run.strategy` (one run, in one Trainer),
:mod:`~mpguide.verify.run.probes` (callbacks that measure), :mod:`~mpguide.verify.run.fabric` and
:mod:`~mpguide.verify.run.distributed` (Fabric and DDP runs), :mod:`~mpguide.verify.run.throughput` (timing),
:mod:`~mpguide.verify.records` (results records), :mod:`~mpguide.verify.claims` (claims and thresholds),
:mod:`~mpguide.verify.gate` (the claim gate and its CLI), :mod:`~mpguide.verify.show.plotting` and
:mod:`~mpguide.verify.show.report` (figures and tables).
"""

from . import errors as _errors

_errors.install()  # an example run as a script prints its input errors in one line (mpguide.verify.errors)
