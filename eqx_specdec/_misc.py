"""Small numeric helpers: the compute dtype, hyperparameter checks, a NumPy softmax."""

import jax
import jax.numpy as jnp
import numpy as np


def compute_dtype(*dtypes) -> np.dtype:
    """The float dtype arithmetic runs in: the widest input float, and at least float32.

    Written by hand because `jnp.promote_types` refuses float32 with float64 under
    `jax_numpy_dtype_promotion="strict"`, which users may have switched on.
    """
    widest = max((np.dtype(d) for d in dtypes), key=lambda d: d.itemsize)
    if widest.itemsize > 4:
        return np.dtype(jnp.float64)
    return np.dtype(jnp.float32)


def check_hyperparameter(name: str, value, low: float, high: float, *, low_open: bool):
    """Raises a ValueError naming `name` if a concrete `value` lies outside its interval
    (`(low, high]` or `[low, high]`). Traced values (a sweep under `jax.jit`) are not
    checked here."""
    if isinstance(value, jax.core.Tracer):
        return
    array = np.asarray(value)
    below = array <= low if low_open else array < low
    if np.any(below) or np.any(array > high) or not np.all(np.isfinite(array)):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"`{name}` must lie in {interval}, got {value}.")


def no_type_check(cls):
    """Exempts a class from the runtime type-checking import hook the test suite
    installs (jaxtyping's hook skips anything decorated `no_type_check`), because the
    class validates its own fields in `__check_init__`, with messages naming the
    argument. Unlike `typing.no_type_check`, it leaves the explicit `@jaxtyped` checks
    of the class's methods on."""
    return cls


def numpy_softmax(logits):
    """The softmax over the last axis of a NumPy array (for building test distributions
    on the host)."""
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def given_as_arrays(*rows) -> bool:
    """Whether the rows (each an array or `None`) are arrays, not warped rows evaluated
    later (`WarpedRows`, `NormalisedRows`): what a pass over the batch's rows reads."""
    return all(a is None or isinstance(a, jax.Array) for a in rows)
