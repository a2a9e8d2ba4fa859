"""The format: what a bundle is on disk, pure and I/O-free (docs/FORMAT.md).

Every name and number of the layout (:mod:`.layout`) and the limits a reader enforces
(:mod:`.limits`); the manifest (:mod:`.manifest`); the sample codec (:mod:`.codec`: msgpack with
extension types, never pickle; :mod:`.encoder` and :mod:`.decoder` its two directions) and one sample outside a bundle (:mod:`.sample`); typed records
(:mod:`.records`); media references and digests (:mod:`.media`); images stored as PNG media
(:mod:`.images`); reading one shard as a stream (:mod:`.shards`); the vocabularies of the API's
options (:mod:`.options`) and the one bounded ``repr`` of error messages (:mod:`.repr`).

This folder imports only :mod:`bundles._errors` outside itself: neither the local half
(:mod:`bundles._local`) nor the store half (:mod:`bundles._store`). Changing a value here changes
the bytes of a bundle (see :mod:`.layout`).
"""
