"""The one mechanism for optional capabilities of stages, verifiers and node rules.

A capability is a method of an abstract base whose default is marked with
[`capability`][eqx_specdec._capabilities.capability]: the default raises
[`eqx_specdec.MissingCapabilityError`][]. A class has the capability when it overrides
that method (or, for a capability declared as a class attribute, such as
`vocab_parallel`, when it sets it to `True`); a class that delegates a capability to its fields (a schedule of two
ratio tests, a tree verifier and its node rule) says so in its class-level
`capabilities_from` declaration, and then has it when each of those fields has theirs.
The library asks [`has_capability`][eqx_specdec._capabilities.has_capability] before
tracing, and a feature that needs a capability calls
[`require`][eqx_specdec._capabilities.require], whose error names that feature.
"""

import functools
from collections.abc import Callable, Iterator

from ._errors import missing_capability


def capability(method: Callable) -> Callable:
    """Marks `method`, on an abstract base, as an optional capability's default: it
    raises [`eqx_specdec.MissingCapabilityError`][] naming the class and the method (a
    feature calls [`require`][eqx_specdec._capabilities.require] first, which names
    the feature too)."""
    name = method.__name__

    @functools.wraps(method)
    def default(self, *args, **kwargs):
        raise missing_capability(self, name, "this feature")

    default.__capability_default__ = True
    return default


def _missing(stage, name: str) -> Iterator[tuple[object, str]]:
    """The `(object, method)` pairs that `stage`'s capability `name` lacks."""
    method = getattr(type(stage), name, None)
    if (
        method is None
        or method is False
        or getattr(method, "__capability_default__", False)
    ):
        yield stage, name
        return
    for field, part in getattr(type(stage), "capabilities_from", {}).get(name, ()):
        yield from _missing(getattr(stage, field), part)


def has_capability(stage, name: str) -> bool:
    """Whether `stage` provides the capability `name` (see the module's docstring)."""
    return next(_missing(stage, name), None) is None


def require(stage, name: str, feature: str, instead: str = "") -> None:
    """Raises [`eqx_specdec.MissingCapabilityError`][] unless `stage` provides `name`:
    the error names the object that lacks it (the stage, or the field it delegates
    to), the method to write, and `feature`, what needed it."""
    lacking = next(_missing(stage, name), None)
    if lacking is not None:
        raise missing_capability(*lacking, feature, instead)
