"""Eager validation of the distributions given to the evaluation tools and the
acceptance objectives: an evaluation of invalid distributions is a wrong number, so it
is refused, with an error naming the argument."""

import jax
import numpy as np

from .._inputs.checks import sum_tolerance


def check_distributions(entry_point: str, *, other_fix: str = "", **arrays) -> None:
    """Raises `ValueError` unless every row of each array given by name (`(..., V)`,
    `None` skipped) is a probability
    distribution: finite, non-negative and summing to 1 within the tolerance of its
    dtype. Skipped for traced values (inside a caller's `jax.jit` or `jax.grad`, where
    the caller vouches for them), so it costs one host read of concrete inputs.
    `other_fix` completes the message's fix (", or pass `logits=True`")."""
    for name, value in arrays.items():
        if value is not None and not isinstance(value, jax.core.Tracer):
            _check(entry_point, name, value, other_fix)


def _check(entry_point: str, name: str, value, other_fix: str) -> None:
    dtype = getattr(value, "dtype", np.float64)
    rows = np.asarray(value, np.float64)
    fix = (
        "Pass probabilities (a softmax of logits), not logits or log-probabilities"
        f"{other_fix}."
    )
    if not np.all(np.isfinite(rows)):
        raise ValueError(
            f"{entry_point}: `{name}` holds a NaN or infinite value. {fix}"
        )
    if np.any(rows < 0):
        raise ValueError(f"{entry_point}: `{name}` holds a negative value. {fix}")
    tolerance = sum_tolerance(dtype if np.dtype(dtype).kind == "f" else np.float64)
    totals = rows.sum(-1)
    bad = np.abs(totals - 1) > tolerance
    if np.any(bad):
        where = np.unravel_index(int(np.argmax(bad)), totals.shape)
        raise ValueError(
            f"{entry_point}: `{name}` has a row summing to {float(totals[where]):.6g} "
            f"(row {tuple(int(i) for i in where)}), not 1 within {tolerance:g}. "
            "Normalise over the vocabulary, `probs / probs.sum(-1, keepdims=True)`."
        )
