"""The ``rollout-bundle`` commands of bundles, below the public module :mod:`bundles.cli`.

:mod:`.common` is the kit every subcommand shares (registration, options, errors, exit status;
exported by :mod:`bundles.support` for the training-side commands); :mod:`.output` what the
bundle commands print. One module per command group, each with a ``register(subparsers)``:
:mod:`.reading` (``inspect``, ``show``, ``diff``, ``verify``), :mod:`.packing` (``pack``,
``unpack``), :mod:`.listing` (``ls``), :mod:`.copying` (``cp``), :mod:`.removing` (``rm``,
``gc``); :func:`bundles.cli.register` calls them in that order (the order of ``--help``). What
the commands compute lives beside them: samples as readable JSON (:mod:`.show`), the differences
of two bundles (:mod:`.diff`), the bundles under a root (:mod:`.find`), a run as a Ray Data
dataset (:mod:`.datasets`, :func:`bundles.read_bundles`). A new command is a
function and its registration in the module of its group, or a new module listed in
:func:`bundles.cli.register`.
"""
