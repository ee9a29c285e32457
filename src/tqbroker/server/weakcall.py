"""``weakly``: a callback to a method that does not keep its object alive."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def weakly(method: Callable[P, R], gone: R) -> Callable[P, R]:
    """``method`` for a helper the connection owns, without a reference to the connection:
    bound methods made reference cycles, so each closed connection (~45 objects) waited for a
    full garbage collection (10k of them: one pause of ~0.8 s) rather than being freed at once."""
    ref = weakref.WeakMethod(method)

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        bound = ref()
        return gone if bound is None else bound(*args, **kwargs)

    return call
