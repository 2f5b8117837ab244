"""The library's exceptions: a stage that lacks a capability a feature needs, and an
invalid input value (or stage output) found at run time."""

import jax


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


class InvalidInputError(jax.errors.JaxRuntimeError):
    """Raised when a value given to an entry point is invalid (a probability that is
    NaN, negative or not normalised, a token id or uniform out of range), or a stage
    returned a value outside its contract.

    Its message starts with the argument (or the stage's class), the problem, the first
    offending row and the fix. On the CPU, every call of an entry point from Python
    raises it at the call, whether or not valid calls came before, for inputs of any
    size: the entry point waits for its program's check before returning. On
    accelerators, and inside your own `jax.jit` (or `eqx.filter_jit`, `jax.vmap`...),
    the check stays in the program (nothing reaches the host on a valid call) and JAX
    reports the error as its own `jax.errors.JaxRuntimeError`, raised when an output is
    read; its message ends with the same text. This class subclasses `JaxRuntimeError`, so
    `except jax.errors.JaxRuntimeError` catches the error on every path.
    """
