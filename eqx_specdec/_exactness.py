"""The exact-only switch: an entry point asked for exact verification refuses a verifier
that is not exact (its `exact` property, read before tracing), and a threshold rule whose
exactness only the run-time checks it turned off would verify."""

from ._stages.threshold_rule import is_threshold_rule


def refuse_inexact(entry: str, verifier, exact_only, check_inputs="read") -> None:
    """Raises, when `exact_only` is True and `verifier.exact` is False, a `ValueError`
    naming `entry`, the verifier and why it is not exact; a `TypeError` when
    `exact_only` is not a Python bool."""
    if not isinstance(exact_only, bool):
        raise TypeError(
            f"{entry}(`exact_only`=...) must be a Python bool, got "
            f"{type(exact_only).__name__}."
        )
    if exact_only and verifier.exact and check_inputs == "off":
        rule = getattr(verifier, "ratio_test", None)
        if is_threshold_rule(rule) and not rule.proven:
            name = type(rule).__name__
            raise ValueError(
                f'{entry}(exact_only=True, check_inputs="off"): {name}\'s exactness '
                "rests on the bound min(q, t) <= p, which only the run-time checks "
                "verify (it is not proven: `proven = False`). Leave `check_inputs` on, "
                f"or declare `proven = True` on {name} if the bound holds for every "
                "input."
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
    if stages:
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
