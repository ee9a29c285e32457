"""``ChangeFlag``: a store's "the next flush has work" attribute, which tells the backend when
set (the log backend flushes only the stores that said so)."""

from __future__ import annotations

from typing import Any


class ChangeFlag:
    """A store's boolean "the next flush has work" attribute (a descriptor): setting it True
    also tells the backend, through the store's ``log.changed``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = "_flag" + name

    def __get__(self, store: object, owner: type | None = None) -> bool:
        return bool(getattr(store, self._name, False))

    def __set__(self, store: Any, dirty: bool) -> None:
        setattr(store, self._name, dirty)
        if dirty:
            store.log.changed()
