"""Typed records: instances of registered frozen dataclasses, stored as a name and a field map.

A trainer's samples hold small frozen dataclasses (Miles' ``AdapterRef(name, slot)``,
``RewardSpec(rm_type, custom_rm_path)``). Pickle would store them by importing whatever class a
file names; bundles never do. Instead:

* A program registers the classes it wants rebuilt, under a stable name of its choosing:
  ``register_record_type(AdapterRef, "miles.AdapterRef")``. Writing an instance of a registered
  class stores ``[name, {field: value, ...}]`` (extension type ``EXT_RECORD``, docs/FORMAT.md);
  field values are any value a sample may hold.
* Reading looks the stored name up among the classes *this* process registered. A registered
  name is rebuilt with ``cls(**fields)``, after checking that the stored field names are exactly
  the class's (anything else is a :class:`BundleFormatError` naming both lists). A name nobody
  registered comes back as a :class:`Record` (the name and the field map), which writes back
  unchanged. A name read from a file is never imported, so reading cannot run code from it.

Several classes may share one name (a project's own ``AdapterRef`` and Miles' are the same
record): each is written under it, and a reader builds the class registered *last* for it.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["Record", "register_record_type"]

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
MAX_NAME_LEN = 200

_lock = threading.Lock()
_name_by_type: dict[type, str] = {}
_type_by_name: dict[str, type] = {}


@dataclasses.dataclass(frozen=True)
class Record:
    """A stored record whose name no registered class claims: ``name`` and its ``fields``.

    Written back, it is stored exactly as it was read. Its fields are not interpreted."""

    name: str
    fields: Mapping[str, Any]

    def __post_init__(self) -> None:
        check_name(self.name, "Record.name")
        if not isinstance(self.fields, Mapping) or not all(isinstance(k, str) for k in self.fields):
            raise TypeError(f"Record.fields: expected a mapping with str keys, found {self.fields!r}")

    def __repr__(self) -> str:
        return f"Record({self.name!r}, {dict(self.fields)!r})"


def check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or len(name) > MAX_NAME_LEN or not NAME_RE.fullmatch(name):
        raise ValueError(
            f"{where}: expected a dotted identifier of at most {MAX_NAME_LEN} characters, found {name!r}"
        )
    return name


def init_field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def register_record_type(cls: type, name: str) -> None:
    """Store instances of the frozen dataclass ``cls`` as records named ``name``, and rebuild
    records of that name as ``cls`` when reading (the class registered last for a name wins).

    Registering a class again under the same name does nothing; under another name is an error.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"register_record_type: expected a dataclass, found {cls!r}")
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(
            f"register_record_type: {cls.__qualname__} is not frozen; only frozen dataclasses are records "
            "(a record is a value, written once and shared)"
        )
    check_name(name, "register_record_type: name")
    with _lock:
        known = _name_by_type.get(cls)
        if known is not None and known != name:
            raise ValueError(
                f"register_record_type: {cls.__module__}.{cls.__qualname__} is registered as {known!r} already"
            )
        _name_by_type[cls] = name
        _type_by_name[name] = cls


def record_name(cls: type) -> str | None:
    """The name instances of ``cls`` are written under, or None when ``cls`` is not registered."""
    return _name_by_type.get(cls)


def record_class(name: str) -> type | None:
    return _type_by_name.get(name)


def registered_types() -> tuple[type, ...]:
    with _lock:
        return tuple(_name_by_type)


def record_fields(obj: Any) -> tuple[str, dict[str, Any]]:
    """``(name, {field: value})`` of a registered instance or a :class:`Record`."""
    if type(obj) is Record:
        return obj.name, dict(obj.fields)
    name = _name_by_type[type(obj)]
    return name, {n: getattr(obj, n) for n in init_field_names(type(obj))}


def build_record(name: Any, fields: Any, *, instantiate: bool = True) -> Any:
    """The value a reader returns for a stored ``[name, fields]``; ``ValueError`` when malformed.

    ``instantiate=False`` checks everything but the class's own validation and returns a
    :class:`Record` (used to locate a problem inside the fields)."""
    check_name(name, "record name")
    if type(fields) is not dict or not all(type(k) is str for k in fields):
        raise ValueError(f"record {name!r}: expected a map of field names to values, found {fields!r}")
    cls = _type_by_name.get(name)
    if cls is None:
        return Record(name, fields)
    expected = init_field_names(cls)
    if set(fields) != set(expected):
        raise ValueError(
            f"record {name!r}: expected fields {list(expected)} (registered class "
            f"{cls.__module__}.{cls.__qualname__}), found {list(fields)}"
        )
    if not instantiate:
        return Record(name, fields)
    try:
        return cls(**fields)
    except Exception as e:  # the class's own validation refused the values
        raise ValueError(
            f"record {name!r}: {cls.__qualname__}(**fields) raised {type(e).__name__}: {e}"
        ) from None
