"""Compilation of the entry points with Equinox's filter semantics and a fast dispatch:
array leaves traced, every other leaf static."""

import functools

import jax
import numpy as np

from ._checks import DeferredCheck


_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic)


def _static_key(leaf):
    # The type too: `1 == 1.0 == True` hash alike but trace differently.
    return type(leaf), leaf


class FilterJit:
    """`fn` compiled as `eqx.filter_jit` would compile it: the array leaves of all its
    arguments (stages and models included) are traced, every other leaf (Python bools,
    ints, floats, strings, callables) is static and part of the cache key.

    One `jax.jit` per static configuration, called with the array leaves only, so a
    call costs a pytree flatten and a dictionary look-up on top of `jax.jit`'s own
    dispatch. Outputs pass through, except a
    [`DeferredCheck`][eqx_specdec._checks.DeferredCheck], which is resolved (raised or
    unwrapped) after the program has finished.
    """

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._compiled = {}

    def _compile(self, treedef, static):
        fn = self._fn

        def run(dynamic):
            leaves = iter(dynamic)
            full = [next(leaves) if s is None else s[1] for s in static]
            args, kwargs = jax.tree_util.tree_unflatten(treedef, full)
            return fn(*args, **kwargs)

        return jax.jit(run)

    def __call__(self, *args, **kwargs):
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        static = tuple(
            None if isinstance(leaf, _ARRAY_TYPES) else _static_key(leaf)
            for leaf in leaves
        )
        key = (treedef, static)
        try:
            compiled = self._compiled.get(key)
        except TypeError:  # an unhashable static leaf
            bad = next(
                leaf
                for leaf, s in zip(leaves, static)
                if s is not None and not _hashable(leaf)
            )
            raise TypeError(
                f"{self.__name__}: an argument holds a {type(bad).__name__}, which is "
                "neither an array nor hashable. Non-array fields of stages and models "
                "are static (compiled in): make it an array (traced) or a hashable "
                "value (a tuple, not a list or dict inside a field)."
            ) from None
        if compiled is None:
            compiled = self._compiled[key] = self._compile(treedef, static)
        outputs = compiled([leaf for leaf, s in zip(leaves, static) if s is None])
        if isinstance(outputs, DeferredCheck):
            return outputs.resolve()
        return outputs

    def __get__(self, instance, owner):
        # Used as a method: bind like a function.
        if instance is None:
            return self
        return functools.partial(self, instance)


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def entry_point(fn):
    """Compiles an entry point with [`FilterJit`][eqx_specdec._jit.FilterJit], after a
    plain Python check of `check_inputs`, so that a traced value (the entry point called
    inside a user's `jax.jit` with `check_inputs` as an argument) gets a message saying
    how to fix it rather than a tracer error."""
    compiled = FilterJit(fn)

    @functools.wraps(fn)
    def wrapper(*args, check_inputs: bool = True, **kwargs):
        if not isinstance(check_inputs, bool):
            raise TypeError(
                "`check_inputs` must be a Python bool, got "
                f"{type(check_inputs).__name__}. Under `jax.jit`, mark it static: "
                f'`jax.jit({fn.__name__}, static_argnames="check_inputs")`.'
            )
        return compiled(*args, check_inputs=check_inputs, **kwargs)

    return wrapper
