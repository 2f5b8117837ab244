"""Compilation of the entry points with Equinox's filter semantics and a fast dispatch:
array leaves traced, every other leaf static."""

import collections
import functools
import threading
import weakref

import equinox as eqx
import jax
import numpy as np

from .checks import check_level, Checked


_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic)
_SCALAR_TYPES = (bool, int, float, str, type(None))
# Static configurations compiled per entry point (least recently used dropped first).
COMPILED_ENTRIES = 64
# Calls remembered by the identity of their Equinox-module arguments (least recently
# used dropped first).
FAST_ENTRIES = 16


def _static_key(leaf):
    # The type too: `1 == 1.0 == True` hash alike but trace differently.
    return type(leaf), leaf


def _is_concrete(leaf) -> bool:
    return not isinstance(leaf, jax.core.Tracer)


class FilterJit:
    """`fn` compiled as `eqx.filter_jit` would compile it: the array leaves of all its
    arguments (stages and models included) are traced, every other leaf (Python bools,
    ints, floats, strings, callables) is static and part of the cache key.

    One `jax.jit` per static configuration, called with the array leaves only, so a
    call costs a pytree flatten and a dictionary look-up on top of `jax.jit`'s own
    dispatch. The common call (positional arrays, keyword modules and Python scalars) skips
    even the flatten: modules are immutable, so one seen before (the same object) has the
    same leaves, remembered with its compiled function. Outputs pass through, except
    [`Checked`][eqx_specdec._verify.checks.Checked] ones: the outputs of a program with
    run-time checks, resolved (raised or unwrapped) after the program has finished.

    **Soundness.**

    - Both caches are bounded least-recently-used maps: at most `COMPILED_ENTRIES` (64)
        static configurations per entry point (a configuration's static leaves, model
        callables included, are held until it is dropped), and `FAST_ENTRIES` (16)
        remembered modules, held by weak reference (a module that is garbage collected
        drops its entry).
    - Nothing traced is remembered: a call whose modules hold tracers (inside a caller's
        `jax.jit`, `jax.vmap` or `jax.grad`) takes the flattening path, which keeps only
        static leaves.
    - The caches are guarded by a lock, so an entry point may be called from several
        threads.
    """

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._lock = threading.Lock()
        self._compiled = collections.OrderedDict()
        self._fast = collections.OrderedDict()

    def _compile(self, treedef, static):
        fn = self._fn

        def run(dynamic):
            leaves = iter(dynamic)
            full = [next(leaves) if s is None else s[1] for s in static]
            args, kwargs = jax.tree_util.tree_unflatten(treedef, full)
            return fn(*args, **kwargs)

        return jax.jit(run)

    def _fast_key(self, args, kwargs):
        """A key for calls whose positional arguments are arrays or `None` and whose
        keyword arguments are Equinox modules (by identity) or Python scalars; `None`
        for any other call."""
        pattern = []
        for a in args:
            if a is None:
                pattern.append(False)
            elif isinstance(a, _ARRAY_TYPES):
                pattern.append(True)
            else:
                return None
        named = []
        for name in sorted(kwargs):
            value = kwargs[name]
            if isinstance(value, eqx.Module):
                named.append((name, id(value)))
            elif isinstance(value, _SCALAR_TYPES):
                named.append((name, type(value), value))
            else:
                return None
        return tuple(pattern), tuple(named)

    def _fast_entry(self, fast, kwargs):
        """The remembered `(module leaves, compiled)` of a fast key whose modules are
        still the very objects passed, or `None`."""
        with self._lock:
            entry = self._fast.get(fast)
            if entry is None:
                return None
            modules, module_leaves, compiled = entry
            if not all(kwargs[name] is ref() for name, ref in modules):
                return None  # a module died and its id was reused
            self._fast.move_to_end(fast)
            return module_leaves, compiled

    def _lookup(self, key, treedef, static):
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                compiled = self._compiled[key] = self._compile(treedef, static)
                while len(self._compiled) > COMPILED_ENTRIES:
                    self._compiled.popitem(last=False)
            else:
                self._compiled.move_to_end(key)
            return compiled

    def __call__(self, *args, **kwargs):
        fast = self._fast_key(args, kwargs)
        entry = None if fast is None else self._fast_entry(fast, kwargs)
        if entry is not None:
            module_leaves, compiled = entry
            dynamic = [a for a in args if a is not None] + module_leaves
            return self._finish(compiled(dynamic))
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        static = tuple(
            None if isinstance(leaf, _ARRAY_TYPES) else _static_key(leaf)
            for leaf in leaves
        )
        key = (treedef, static)
        try:
            hash(key)
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
        compiled = self._lookup(key, treedef, static)
        dynamic = [leaf for leaf, s in zip(leaves, static) if s is None]
        if fast is not None:
            self._remember(fast, kwargs, compiled)
        return self._finish(compiled(dynamic))

    def _remember(self, fast, kwargs, compiled):
        # The flatten order is the positional arguments, then the keywords sorted by
        # name: the modules' array leaves follow the positional arrays in that order.
        modules = [
            (name, kwargs[name])
            for name in sorted(kwargs)
            if isinstance(kwargs[name], eqx.Module)
        ]
        module_leaves = [
            leaf
            for _, module in modules
            for leaf in jax.tree_util.tree_leaves(module)
            if isinstance(leaf, _ARRAY_TYPES)
        ]
        if not all(map(_is_concrete, module_leaves)):
            return  # never keep a tracer beyond its trace
        try:
            refs = tuple((name, weakref.ref(module)) for name, module in modules)
        except TypeError:  # a module type without weak references: not remembered
            return
        with self._lock:
            self._fast[fast] = (refs, module_leaves, compiled)
            self._fast.move_to_end(fast)
            while len(self._fast) > FAST_ENTRIES:
                self._fast.popitem(last=False)

    def cache_sizes(self) -> tuple[int, int]:
        """How many static configurations and remembered modules are held now."""
        with self._lock:
            return len(self._compiled), len(self._fast)

    @staticmethod
    def _finish(outputs):
        if isinstance(outputs, Checked):
            return outputs.resolve()
        return outputs


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def entry_point(fn):
    """Compiles an entry point with [`FilterJit`][eqx_specdec._verify.dispatch.FilterJit], after a
    plain Python check of `check_inputs` (so that a traced or misspelt value gets a
    message saying how to fix it rather than a tracer error)."""
    compiled = FilterJit(fn)

    @functools.wraps(fn)
    def wrapper(*args, check_inputs="read", **kwargs):
        check_level(check_inputs)
        return compiled(*args, check_inputs=check_inputs, **kwargs)

    return wrapper
