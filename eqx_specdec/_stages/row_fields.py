"""Per-row field values of a ratio test (its `row_fields`): finding them, and one
row's test."""

import equinox as eqx
import jax
import numpy as np


def per_row_values(test) -> dict:
    """The row fields of `test` that hold one value per row (one axis more than a row's
    value), by name."""
    values = {}
    for name, rank in test.row_fields.items():
        value = getattr(test, name)
        if isinstance(value, jax.Array | np.ndarray) and value.ndim == rank + 1:
            values[name] = value
    return values


def with_row_values(test, values: dict):
    """`test` with its per-row fields replaced by one row's `values`."""
    if not values:
        return test
    names = tuple(values)
    return eqx.tree_at(
        lambda t: [getattr(t, n) for n in names], test, [values[n] for n in names]
    )
