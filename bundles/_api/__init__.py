"""The API above both halves: :class:`~bundles.Location` and the entry points that take one.

:mod:`.location` decides once, at the entry, what a location is (a directory, a packed file, a
prefix or a packed object on a store) and answers every question about it by what the location
declares, never by asking its kind at a call site; :mod:`.entry` holds ``write_bundle``,
``open_bundle``, ``pack_bundle``, ``unpack_bundle``, ``is_bundle``, ``list_bundles`` and
``remove_bundle``, each building the :class:`~bundles.Location` its argument names. This folder is
the one place below the face that imports both the local half (:mod:`bundles._local`) and the
store half (:mod:`bundles._store`).
"""
