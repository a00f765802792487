"""``python -m mpguide.verify.records``: upgrade schema-1 records in place (see ``--help``)."""

import sys

from . import _upgrade_cli

sys.exit(_upgrade_cli())
