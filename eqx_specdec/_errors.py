"""The library's own exception for a stage that lacks a capability a feature needs."""


class MissingCapabilityError(NotImplementedError):
    """Raised when a feature needs a capability that a stage does not provide.

    Every capability of a stage is a documented method of its abstract base (for example
    [`eqx_specdec.AbstractRatioTest.vocab_parallel`][] for vocabulary sharding, or
    [`eqx_specdec.AbstractRatioTest.pass_probabilities`][] for the decoding loop's
    theory). The base's default raises this error, naming the class, the method to
    write and what to do instead; the library never falls back silently.
    """


def missing_capability(
    stage, method: str, feature: str, instead: str = ""
) -> MissingCapabilityError:
    """The error for `stage` lacking `method`, needed by `feature`."""
    name = type(stage).__name__
    message = (
        f"{name} does not implement `{method}`, which {feature} needs. Implement "
        f"`{name}.{method}` (see the abstract base's documentation)"
    )
    return MissingCapabilityError(message + (f", or {instead}." if instead else "."))


def missing_quadrature(stage) -> MissingCapabilityError:
    """The error for a stage without `quadrature_breakpoints`."""
    return missing_capability(
        stage,
        "quadrature_breakpoints",
        "exact quadrature",
        'use method="monte-carlo", or pass the breakpoints to emission_by_quadrature '
        "yourself",
    )


def missing_vocab_parallel(stage) -> MissingCapabilityError:
    """The error for a stage without `vocab_parallel`."""
    return missing_capability(
        stage,
        "vocab_parallel",
        "vocabulary sharding (ShardedVerifier with vocab_axis)",
        "shard over the batch only (vocab_axis=None), where every stage runs unchanged",
    )


def implements(stage, base, method: str) -> bool:
    """Whether `stage`'s class overrides `base.method` (its capability's default)."""
    return getattr(type(stage), method) is not getattr(base, method)
