"""Registries of pluggable parts (the serving simulator's scheduling policies and routers, cost
models), keyed by an Enum member whose value is the name users type (``--policy chunked``,
``--cost-model datasheet``), as in vidur.

A part is a class with a ``key`` class attribute (a member of a ``str`` Enum: the built-ins'
enum, or one the new part's own module defines) registered with :meth:`EnumRegistry.register`;
third-party packages can also name it in an entry-point group. See docs/extending.md.

>>> from enum import Enum
>>> class Color(str, Enum):
...     RED = "red"
>>> class Paint:
...     key = Color.RED
>>> paints = EnumRegistry("paint", Paint)
>>> _ = paints.register(Paint)
>>> paints.names(), paints.get("red") is Paint, paints.key("red") is Color.RED
(('red',), True, True)
>>> paints.get("blue")
Traceback (most recent call last):
...
whatif.core.errors.WhatifError: unknown paint 'blue' (paints: red)
"""
from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Generic, TypeVar

from .errors import WhatifError
from .plugins import load_plugins

T = TypeVar("T", bound=type)


class EnumRegistry(Generic[T]):
    """Classes of one kind (subclasses of ``base``) by Enum key; lookups by member or by value."""

    def __init__(self, what: str, base: type, builtin_modules: Sequence[str] = (),
                 entry_point_group: str | None = None, plural: str | None = None,
                 error: type[WhatifError] = WhatifError) -> None:
        self.what, self.base, self.plural, self.error = what, base, plural or f"{what}s", error
        self._builtin_modules, self._group = tuple(builtin_modules), entry_point_group
        self._classes: dict[Enum, T] = {}
        self._loaded = False

    def register(self, cls: T) -> T:
        """Class decorator: make ``cls`` available under ``cls.key`` (a ``str`` Enum member)."""
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"{cls!r} is not a {self.base.__name__}")
        key = vars(cls).get("key")
        if not (isinstance(key, Enum) and isinstance(key.value, str)):
            raise TypeError(f"{cls.__name__}.key must be a member of a str Enum, got {key!r}")
        taken = self._by_value().get(key.value)
        if taken is not None and taken is not key:
            raise TypeError(f"{cls.__name__}: {self.what} name {key.value!r} is taken by {taken!r}")
        self._classes[key] = cls
        return cls

    def unregister(self, key: Enum) -> None:
        """Forget the class registered under ``key``."""
        self._classes.pop(key, None)

    def _load(self) -> None:
        """Import the built-ins, then the entry points; a broken plugin is one error naming it."""
        if self._loaded:
            return
        load_plugins(self._builtin_modules, self._group, self.register, what=self.what, error=self.error)
        self._loaded = True

    def _by_value(self) -> dict[str, Enum]:
        return {k.value: k for k in self._classes}

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        self._load()
        return tuple(k.value for k in self._classes)

    def key(self, name: str | Enum) -> Enum:
        """The registered key of ``name`` (a key, or its value); else ``error`` listing them."""
        self._load()
        if isinstance(name, Enum) and name in self._classes:
            return name
        found = self._by_value().get(name.value if isinstance(name, Enum) else name)
        if found is None:
            shown = name.value if isinstance(name, Enum) else name
            raise self.error(f"unknown {self.what} {shown!r} ({self.plural}: {', '.join(self.names())})")
        return found

    def get(self, name: str | Enum) -> T:
        """The class registered under ``name`` (a key, or its value)."""
        return self._classes[self.key(name)]
