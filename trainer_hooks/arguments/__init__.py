"""Command-line options: Miles' own (kept as Miles defines them) and ours, and parse-time checks.

* :mod:`._options`: :func:`add_arguments` (usable as Miles' parser hook), :func:`parse_args`,
  :func:`validate_args`; the table of this project's settings :data:`SETTINGS` (whence
  :data:`OWN_OPTIONS`, :func:`add_own_arguments`, :func:`check_settings`,
  :func:`validate_settings`) and :data:`MILES_OPTIONS` (from :mod:`._miles_options`, the table
  of Miles' own definitions).
* :mod:`._processor`: :class:`RolloutEngineProcessorArgs`, which resolves every engine group's
  image-processor settings and refuses groups that disagree, at launch.
"""

from trainer_hooks.arguments import _options, _processor
from trainer_hooks.arguments._options import *  # noqa: F403
from trainer_hooks.arguments._processor import *  # noqa: F403

# The surface is what the two modules declare public: each list is kept once, in its module.
__all__ = [*_options.__all__, *_processor.__all__]
