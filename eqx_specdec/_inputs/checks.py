"""Run-time checks of the values given to the entry points, and of what the stages
return: the check levels, the problems each finds, and the one error they raise.

Each check is a [`Problem`][eqx_specdec._inputs.results.Problem]: per-row flags
`(B,)`, its member of [`eqx_specdec.RESULTS`][] and a message template with a `{row}`
field, built once per compiled program (never once per row, so compile time does not
grow with the batch).
"""

from typing import Literal

import jax
import jax.numpy as jnp

from .._misc import compute_dtype
from .results import Problem, RESULTS


CheckLevel = Literal["read", "all", "off"]
"""The run-time check level of the verification entry points' `check_inputs`: `"read"`
(every value the verification reads; the default), `"all"` (every value of every
input) or `"off"` (nothing)."""

_LEVELS = '`check_inputs` must be "read" (check every value the verification reads), '
_LEVELS += '"all" (every value of every input) or "off" (nothing)'


def check_level(check_inputs) -> Literal["read", "all"] | None:
    """The check level a `check_inputs` argument asks for: `"read"`, `"all"`, or `None`
    for `"off"`. A `TypeError` naming the argument and the fix for anything else."""
    if isinstance(check_inputs, jax.core.Tracer):
        raise TypeError(
            f"{_LEVELS}; got a traced value. Under `jax.jit`, mark it static: "
            '`jax.jit(entry_point, static_argnames="check_inputs")`.'
        )
    if isinstance(check_inputs, bool):
        hint = '"read"' if check_inputs else '"off"'
        raise TypeError(
            f"{_LEVELS}; got {check_inputs!r}. The check level is a string: pass "
            f"`check_inputs={hint}`."
        )
    if isinstance(check_inputs, str) and check_inputs in ("read", "all"):
        return check_inputs
    if isinstance(check_inputs, str) and check_inputs == "off":
        return None
    raise TypeError(f"{_LEVELS}; got {check_inputs!r}.")


def sum_tolerance(dtype) -> float:
    """How far from 1 a distribution's sum may be: rounding of a normalised float32 row
    is far below 1e-3; float16 and bfloat16 rows carry 3 significant digits at best."""
    return 1e-2 if jnp.dtype(dtype).itemsize <= 2 else 1e-3


_NON_FINITE = (
    "`{name}` holds a NaN or infinite value in row {{row}} (the first such row). Pass "
    "finite probabilities (a softmax of finite logits); give a masked token probability "
    "0, or call the logits entry point with -inf logits."
)
_NEGATIVE = (
    "`{name}` holds a negative probability in row {{row}} (the first such row). Clip "
    "rounding noise with `jnp.maximum(probs, 0)` and renormalise."
)
_BAD_SUM = (
    "`{name}` has a distribution whose sum is not within {tol:g} of 1 in row {{row}} (the "
    "first such row). Normalise over the vocabulary, `probs / probs.sum(-1, "
    "keepdims=True)`, or pass the logits as `eqx_specdec.Logits`."
)


def bad_sum_message(name, dtype) -> str:
    return _BAD_SUM.format(name=name, tol=sum_tolerance(dtype))


def distribution_flags(name, dtype, total, negative):
    """The three problems of a probability distribution from its sum and whether it
    holds a negative entry (flags of any shape `(B, ...)`): the sum is non-finite
    exactly when some entry is."""
    non_finite = ~jnp.isfinite(total)
    tol = sum_tolerance(dtype)
    bad_sum = (jnp.abs(total - 1) > tol) & ~non_finite & ~negative
    return [
        Problem(
            _per_row(non_finite),
            RESULTS.invalid_probability,
            _NON_FINITE.format(name=name),
        ),
        Problem(
            _per_row(negative & ~non_finite),
            RESULTS.invalid_probability,
            _NEGATIVE.format(name=name),
        ),
        Problem(
            _per_row(bad_sum), RESULTS.not_normalised, bad_sum_message(name, dtype)
        ),
    ]


def distribution_problems(name, probs):
    """The problems of every distribution of a probability array `(B, ..., V)`: a sum
    and a minimum over the vocabulary (two passes on XLA CPU, which does not fuse them)."""
    dtype = compute_dtype(probs.dtype)
    vocab = probs.shape[-1]
    # As (V / 16, 16) with the reductions over the middle axis: XLA CPU keeps 16
    # accumulators in a vector register (a reduction over the minor axis runs one
    # scalar chain), so the two reductions cost little more than one read.
    lanes = 16 if vocab % 16 == 0 else 1
    rows = probs.reshape(probs.shape[:-1] + (vocab // lanes, lanes))
    total = jnp.sum(jnp.sum(rows, axis=-2, dtype=dtype), axis=-1)
    negative = jnp.min(jnp.min(rows, axis=-2), axis=-1) < 0
    return distribution_flags(name, probs.dtype, total, negative)


def _per_row(flags):
    """Reduces a (B, ...) boolean array to (B,)."""
    return jnp.any(flags, axis=tuple(range(1, flags.ndim))) if flags.ndim > 1 else flags


def logit_problems(name, logits=None, *, normalisers=None):
    """Per-row flags (B,) for a logit array: NaN or +inf anywhere, or a distribution
    with no finite logit (every token masked). One reduction: the maximum (the warp
    computes the same one); or, from `normalisers`, the rows' log-normalisers
    `(B, ...)` as the warp found them (0 for a row the checks skip), which are NaN,
    +inf and -inf exactly where the maximum is."""
    if normalisers is not None:
        highest = normalisers
    else:
        highest = jnp.max(logits, axis=-1).astype(compute_dtype(logits.dtype))
    bad = jnp.isnan(highest) | (highest == jnp.inf)
    empty = highest == -jnp.inf
    return [
        Problem(
            _per_row(bad),
            RESULTS.invalid_logit,
            f"`{name}` holds a NaN or +inf logit in row {{row}} (the first such row). "
            "Mask a token with -inf, never NaN or +inf.",
        ),
        Problem(
            _per_row(empty),
            RESULTS.all_masked,
            f"`{name}` has a distribution whose logits are all -inf in row {{row}} (the "
            "first such row). Leave at least one token of each distribution unmasked.",
        ),
    ]


def token_problems(tokens, vocab, name="draft_tokens", valid=None):
    outside = (tokens < 0) | (tokens >= vocab)
    if valid is not None:
        outside = outside & valid
    return [
        Problem(
            _per_row(outside),
            RESULTS.token_out_of_range,
            f"`{name}` holds a token id outside [0, V) = [0, {vocab}) in row {{row}} (the "
            "first such row). Token ids index the target's vocabulary: map ids from "
            "another vocabulary into it.",
        )
    ]


def uniform_problems(name, uniforms):
    # `~(0 <= u < 1)` also catches NaN.
    outside = ~((uniforms >= 0) & (uniforms < 1))
    return [
        Problem(
            _per_row(outside),
            RESULTS.uniform_out_of_range,
            f"`{name}` holds a value outside [0, 1) in row {{row}} (the first such row). "
            "Draw uniforms with `jax.random.uniform(key, shape)`, which lies in [0, 1).",
        )
    ]


def stage_problem(stage, role: str, flags, returned: str, contract: str):
    """The problem of a stage that returned a value outside its contract."""
    name = type(stage).__name__
    return Problem(
        flags,
        RESULTS.invalid_stage_output,
        f"{name} (the {role}) returned {returned} in row {{row}} (the first such row). "
        f"Fix {name}: {contract}",
    )


_MODEL_OUTPUT = (
    "`{name}` returned a distribution that is not one (a NaN or infinite value, a "
    "negative probability, or a sum not within {tol:g} of 1) for row {{row}} (the first "
    "such row), at the step `DecodeResult.error_steps` gives for it. Return probabilities normalised over the "
    'vocabulary, or finite logits with `outputs="logits"`.'
)

#: The messages of `model_problems`, in order.
MODEL_MESSAGES = tuple(
    _MODEL_OUTPUT.format(name=name, tol=sum_tolerance(jnp.float32))
    for name in ("draft_model", "target_model")
)


def invalid_distributions(probs, used=None):
    """Per leading row `(B,)`, whether any distribution of `probs` `(B, ..., V)` (where
    `used`, `(B, ...)`, marks it) is not one: a NaN or infinite value, a negative one,
    or a sum not within tolerance of 1."""
    total = jnp.sum(probs, axis=-1, dtype=jnp.float32)
    bad = ~jnp.isfinite(total) | (jnp.min(probs, axis=-1) < 0)
    bad = bad | (jnp.abs(total - 1) > sum_tolerance(jnp.float32))
    if used is not None:
        bad = bad & used
    return _per_row(bad)


def model_problems(invalid, active):
    """Per-row flags `(B,)` for what the loop's models returned this step (a proposal
    step's `invalid`: the draft's and the target's flags, from
    `invalid_distributions`, `None` for none), on the rows still `active`; in the
    order of `MODEL_MESSAGES`."""
    return [
        Problem(
            jnp.zeros_like(active) if flags is None else flags & active,
            RESULTS.invalid_model_output,
            message,
        )
        for flags, message in zip(invalid, MODEL_MESSAGES, strict=True)
    ]
