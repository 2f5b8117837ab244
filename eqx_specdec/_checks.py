"""Run-time checks of the values given to `speculative_accept`, inside `jax.jit` too."""

import equinox as eqx
import jax.numpy as jnp

from ._misc import compute_dtype


def sum_tolerance(dtype) -> float:
    """How far from 1 a distribution's sum may be: rounding of a normalised float32 row
    is far below 1e-3; float16 and bfloat16 rows carry 3 significant digits at best."""
    return 1e-2 if jnp.dtype(dtype).itemsize <= 2 else 1e-3


def _distribution_problems(name, probs):
    """Per-row flags (B,) for one probability array, with their messages."""
    wide = probs.astype(compute_dtype(probs.dtype))
    axes = tuple(range(1, probs.ndim))
    finite = jnp.isfinite(wide)
    non_finite = ~jnp.all(finite, axis=axes)
    negative = jnp.any(wide < 0, axis=axes)
    tol = sum_tolerance(probs.dtype)
    sums = jnp.sum(jnp.where(finite, wide, 0), axis=-1)
    bad_sum = jnp.any(jnp.abs(sums - 1) > tol, axis=-1)
    return [
        (non_finite, f"`{name}` holds a NaN or infinite value"),
        (negative, f"`{name}` holds a negative probability"),
        (
            bad_sum & ~non_finite & ~negative,
            f"`{name}` has a distribution whose sum is not within {tol:g} of 1",
        ),
    ]


def check_values(
    outputs, draft_tokens, draft_probs, target_probs, accept_uniforms, sample_uniforms
):
    """Returns `outputs` unchanged, raising at run time if an input value is invalid.

    The error names the first problem found and the first offending row. Under
    `jax.jit` it surfaces as a `RuntimeError` carrying the message.
    """
    batch = draft_tokens.shape[0]
    vocab = target_probs.shape[-1]
    tokens = draft_tokens
    problems = [
        (
            jnp.any((tokens < 0) | (tokens >= vocab), axis=1),
            f"`draft_tokens` holds a token id outside [0, V) = [0, {vocab})",
        )
    ]
    if draft_probs is not None:
        problems += _distribution_problems("draft_probs", draft_probs)
    problems += _distribution_problems("target_probs", target_probs)
    for name, uniforms in (
        ("accept_uniforms", accept_uniforms),
        ("sample_uniforms", sample_uniforms),
    ):
        # `~(0 <= u < 1)` also catches NaN.
        outside = ~((uniforms >= 0) & (uniforms < 1))
        if uniforms.ndim > 1:
            outside = jnp.any(outside, axis=1)
        problems.append((outside, f"`{name}` holds a value outside [0, 1)"))

    flags = jnp.stack([flag for flag, _ in problems])  # (problems, batch)
    any_problem = jnp.any(flags)
    per_problem = jnp.any(flags, axis=1)
    first_problem = jnp.argmax(per_problem)
    first_row = jnp.argmax(flags[first_problem])
    index = first_problem * batch + first_row
    messages = [
        f"{message} (first in row {row}). Fix the input (probabilities must be finite, "
        "non-negative and normalised over the vocabulary), or pass "
        "`check_inputs=False` to skip these checks."
        for _, message in problems
        for row in range(batch)
    ]
    return eqx.branched_error_if(outputs, any_problem, index, messages)
