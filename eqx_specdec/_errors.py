"""The library's exception for a stage that lacks a capability a feature needs (an
invalid value found at run time is an [`eqx_specdec.RESULTS`][] member)."""


class MissingCapabilityError(NotImplementedError):
    """Raised when a feature needs a capability that a stage does not provide.

    Every capability of a stage is a documented method of its abstract base (for example
    `vocab_parallel = True` on a ratio test for vocabulary sharding, or
    [`eqx_specdec.AbstractRatioTest.pass_probabilities`][] for the decoding loop's
    theory). The base's default raises this error, naming the class, the method to
    write and what to do instead; the library never falls back silently.
    """


def missing_capability(
    stage, method: str, feature: str, instead: str = ""
) -> MissingCapabilityError:
    """The error for `stage` lacking `method`, needed by `feature`."""
    name = type(stage).__name__
    if isinstance(getattr(type(stage), method, None), bool):  # a declaration
        message = (
            f"{name} does not declare `{method} = True`, which {feature} needs. "
            f"Write `{name}.__call__` with its RowContext's reductions and declare "
            f"`{method} = True` (see the abstract base's documentation)"
        )
    else:
        message = (
            f"{name} does not implement `{method}`, which {feature} needs. Implement "
            f"`{name}.{method}` (see the abstract base's documentation)"
        )
    return MissingCapabilityError(message + (f", or {instead}." if instead else "."))
