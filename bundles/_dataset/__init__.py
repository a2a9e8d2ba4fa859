"""A run as a dataset: bundles' samples as Arrow (docs/DATASET.md).

``arrow`` owns the versioned schema and the streaming conversion (``Bundle.to_arrow`` delegates to
it); ``sft`` the layout TRL's vision SFT takes. This folder imports only the format
(``bundles._format``): the local reader imports it, so it reads a bundle through the reader's
public methods; where the rows go (``rollout-bundle export``) is ``bundles._commands.exporting``.
"""

from bundles._dataset.arrow import COLUMNS, SCHEMA_VERSION, identity, schema, step_of, to_arrow
from bundles._dataset.sft import Conventions, sft_rows, sft_schema

__all__ = [
    "COLUMNS",
    "SCHEMA_VERSION",
    "Conventions",
    "identity",
    "schema",
    "sft_rows",
    "sft_schema",
    "step_of",
    "to_arrow",
]
