"""The exact-only switch: an entry point asked for exact verification refuses a verifier
that is not exact (its `exact` property, read before tracing)."""


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
