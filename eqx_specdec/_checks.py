"""Run-time checks of the values given to `speculative_accept`, inside `jax.jit` too."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from ._misc import compute_dtype


def sum_tolerance(dtype) -> float:
    """How far from 1 a distribution's sum may be: rounding of a normalised float32 row
    is far below 1e-3; float16 and bfloat16 rows carry 3 significant digits at best."""
    return 1e-2 if jnp.dtype(dtype).itemsize <= 2 else 1e-3


def distribution_problems(name, probs):
    """Per-row flags (B,) for a probability array, with their messages.

    Two reductions over the vocabulary, which XLA fuses into one read: the sum (NaN or
    infinite exactly when some entry is) and the minimum (negative when some entry is).
    """
    dtype = compute_dtype(probs.dtype)
    total = jnp.sum(probs, axis=-1, dtype=dtype)
    lowest = jnp.min(probs, axis=-1).astype(dtype)
    non_finite = ~jnp.isfinite(total)
    negative = lowest < 0
    tol = sum_tolerance(probs.dtype)
    bad_sum = jnp.abs(total - 1) > tol
    return [
        (_per_row(non_finite), f"`{name}` holds a NaN or infinite value"),
        (_per_row(negative), f"`{name}` holds a negative probability"),
        (
            _per_row(bad_sum & ~non_finite & ~negative),
            f"`{name}` has a distribution whose sum is not within {tol:g} of 1",
        ),
    ]


def _per_row(flags):
    """Reduces a (B, ...) boolean array to (B,)."""
    return jnp.any(flags, axis=tuple(range(1, flags.ndim))) if flags.ndim > 1 else flags


def logit_problems(name, logits):
    """Per-row flags (B,) for a logit array: NaN or +inf anywhere, or a distribution
    with no finite logit (every token masked). One reduction: the maximum."""
    highest = jnp.max(logits, axis=-1).astype(compute_dtype(logits.dtype))
    bad = jnp.isnan(highest) | (highest == jnp.inf)
    empty = highest == -jnp.inf
    return [
        (_per_row(bad), f"`{name}` holds a NaN or +inf logit"),
        (_per_row(empty), f"`{name}` has a distribution whose logits are all -inf"),
    ]


def token_problems(draft_tokens, vocab, name="draft_tokens"):
    outside = (draft_tokens < 0) | (draft_tokens >= vocab)
    return [
        (
            _per_row(outside),
            f"`{name}` holds a token id outside [0, V) = [0, {vocab})",
        )
    ]


def uniform_problems(name, uniforms):
    # `~(0 <= u < 1)` also catches NaN.
    outside = ~((uniforms >= 0) & (uniforms < 1))
    return [(_per_row(outside), f"`{name}` holds a value outside [0, 1)")]


def _message(problem: str, row) -> str:
    return (
        f"{problem} (first in row {row}). Fix the input (probabilities must be finite, "
        "non-negative and normalised over the vocabulary), or pass "
        "`check_inputs=False` to skip these checks."
    )


class DeferredCheck(eqx.Module):
    """What a program over several devices returns in place of raising from inside: the
    outputs, and the index of the first problem found (or -1). The entry point raises
    it after the program has finished (an error raised on one device would leave the
    others waiting in a collective)."""

    outputs: dict
    index: Int[Array, ""]
    problems: tuple[str, ...] = eqx.field(static=True)
    batch: int = eqx.field(static=True)

    def resolve(self) -> dict:
        """The outputs, or the `RuntimeError` for the problem found."""
        if isinstance(self.index, jax.core.Tracer):
            raise TypeError(
                "A ShardedVerifier cannot check input values at run time inside a "
                "`jax.jit` of yours: an error raised on one device would leave the "
                "others waiting. Call the entry point outside `jax.jit` (it compiles "
                "itself) to have the values checked, or pass `check_inputs=False`."
            )
        index = int(self.index)
        if index >= 0:
            problem, row = divmod(index, self.batch)
            raise RuntimeError(_message(self.problems[problem], row))
        return self.outputs


def raise_first_problem(outputs, problems, *, deferred: bool = False):
    """Returns `outputs` unchanged, raising at run time if any problem flag is set.

    `problems` is a list of `(flags, message)` with `flags` boolean of shape `(B,)`. The
    error names the first problem in the list that occurs and its first offending row.
    Under `jax.jit` it surfaces as a `RuntimeError` carrying the message.

    With `deferred=True` (programs spread over several devices), returns a
    [`DeferredCheck`][eqx_specdec._checks.DeferredCheck] for the entry point to resolve
    after the program has finished.
    """
    flags = jnp.stack([flag for flag, _ in problems])  # (problems, batch)
    batch = flags.shape[1]
    any_problem = jnp.any(flags)
    first_problem = jnp.argmax(jnp.any(flags, axis=1))
    first_row = jnp.argmax(flags[first_problem])
    index = first_problem * batch + first_row
    if deferred:
        index = jnp.where(any_problem, index, -1).astype(jnp.int32)
        return DeferredCheck(outputs, index, tuple(m for _, m in problems), batch)
    messages = [
        _message(message, row) for _, message in problems for row in range(batch)
    ]
    return eqx.branched_error_if(outputs, any_problem, index, messages)
