"""Exactness held to its declaration: the claims the evaluation tools have measured
false in this process, and the exact-only switch (an entry point asked for exact
verification refuses a verifier that is not exact, or whose claim a tool refuted)."""

import dataclasses

import equinox as eqx


# The verifiers a tool measured lossy though they declare themselves exact, by their
# composition (the verifier's class and its stages' classes): a class's `exact = True`
# is a claim about all its instances, and one measurement refutes it.
_REFUTED: dict[tuple, str] = {}


def _composition(module) -> tuple:
    """The classes a verifier is built from: its own, then each field's that is a
    module, recursively (a node rule's threshold rule included)."""
    parts = [type(module)]
    for field in dataclasses.fields(module):
        value = getattr(module, field.name, None)
        if isinstance(value, eqx.Module):
            parts.append(_composition(value))
    return tuple(parts)


def refute(verifier, measured: str) -> None:
    """Records that a tool measured `verifier`, declared exact, lossy (`measured` says
    how): from then on, verifiers of its composition are not `exact`."""
    _REFUTED[_composition(verifier)] = measured


def refutation(verifier) -> str | None:
    """What a tool measured of a verifier of this composition declared exact, or
    `None` when no tool has refuted its claim."""
    return _REFUTED.get(_composition(verifier))


def refuse_inexact(entry: str, verifier, exact_only) -> None:
    """Raises, when `exact_only` is True and `verifier.exact` is False, a `ValueError`
    naming `entry`, the verifier and why it is not exact; a `TypeError` when
    `exact_only` is not a Python bool."""
    if not isinstance(exact_only, bool):
        raise TypeError(
            f"{entry}(`exact_only`=...) must be a Python bool, got "
            f"{type(exact_only).__name__}."
        )
    if not exact_only or verifier.exact:
        return
    stages = [
        stage
        for stage in (
            getattr(verifier, "ratio_test", None),
            getattr(verifier, "node_rule", None),
        )
        if stage is not None and not stage.exact
    ]
    measured = refutation(verifier)
    if measured is not None:
        why = f"it declares itself exact, but {measured}"
    elif stages:
        names = ", ".join(type(stage).__name__ for stage in stages)
        why = f"{names} declares `exact = False` (a lossy rule)"
    else:
        why = "its stages do not fit one another (built with `allow_mismatch=True`)"
    raise ValueError(
        f"{entry}(exact_only=True): `verifier` ({type(verifier).__name__}) is not "
        f"exact: {why}. Pass an exact verifier (`verifier.exact` is True: the standard, "
        "greedy or block rule, a tree rule), or leave `exact_only` out to run a lossy "
        "one."
    )
