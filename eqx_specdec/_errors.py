"""The library's exceptions: a stage that lacks a capability a feature needs, and an
invalid input value (or stage output) found at run time."""

import equinox as eqx
import jax


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


class InvalidInputError(eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError):
    """Raised when a value given to an entry point is invalid (a probability that is
    NaN, negative or not normalised, a token id or uniform out of range), or a stage
    returned a value outside its contract.

    Its message starts with the argument (or the stage's class), the problem, the first
    offending row and the fix. A call of an entry point from Python raises it at the
    call, whether or not valid calls came before, for inputs of any size (the entry
    point reads its program's check status, two integers, before returning).

    Inside your own `eqx.filter_jit` (or under `jax.vmap`), the check is a branch of
    your program taken only on a problem (nothing reaches the host on a valid call):

    - with one device, Equinox's `eqx.branched_error_if`: Equinox raises its
        `eqx.EquinoxRuntimeError` (this class's base) with the same message when the
        outputs are computed, so that `except eqx.EquinoxRuntimeError` catches the
        error on every path Equinox compiles;
    - with several devices, a `jax.debug.callback` (an error raised inside a
        multi-device program stops one device while the others wait: XLA aborts the
        process): JAX raises `jax.errors.JaxRuntimeError` (this class's other base)
        with the same message when the outputs are read.

    Under a plain `jax.jit` on one device, JAX raises Equinox's failed callback itself,
    as `jax.errors.JaxRuntimeError` (or `ValueError` on its fast dispatch path); its text
    holds the same message. To handle invalid inputs without exceptions on any path,
    pass `throw=False` to [`eqx_specdec.verify`][] and read `Verification.result`.
    """
