"""Run-time checks of the values given to the entry points, and of what the stages
return: the check levels, the problems each finds, and the one error they raise.

A problem is a pair `(flags, message)`: `flags` boolean of shape `(B,)`, `message` a
template with a `{row}` field. The messages are built once per compiled program (never
once per row, so compile time does not grow with the batch); the program returns, beside
its outputs, the index of the first problem found and its first row, and the entry point
raises [`eqx_specdec.InvalidInputError`][] from them.
"""

import functools
from collections.abc import Sequence
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from .._errors import InvalidInputError
from .._misc import compute_dtype


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
    "keepdims=True)`, or pass the logits to `speculative_accept_logits`."
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
        (_per_row(non_finite), _NON_FINITE.format(name=name)),
        (_per_row(negative & ~non_finite), _NEGATIVE.format(name=name)),
        (_per_row(bad_sum), bad_sum_message(name, dtype)),
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


def logit_problems(name, logits):
    """Per-row flags (B,) for a logit array: NaN or +inf anywhere, or a distribution
    with no finite logit (every token masked). One reduction: the maximum (the warp
    computes the same one)."""
    highest = jnp.max(logits, axis=-1).astype(compute_dtype(logits.dtype))
    bad = jnp.isnan(highest) | (highest == jnp.inf)
    empty = highest == -jnp.inf
    return [
        (
            _per_row(bad),
            f"`{name}` holds a NaN or +inf logit in row {{row}} (the first such row). "
            "Mask a token with -inf, never NaN or +inf.",
        ),
        (
            _per_row(empty),
            f"`{name}` has a distribution whose logits are all -inf in row {{row}} (the "
            "first such row). Leave at least one token of each distribution unmasked.",
        ),
    ]


def token_problems(tokens, vocab, name="draft_tokens", valid=None):
    outside = (tokens < 0) | (tokens >= vocab)
    if valid is not None:
        outside = outside & valid
    return [
        (
            _per_row(outside),
            f"`{name}` holds a token id outside [0, V) = [0, {vocab}) in row {{row}} (the "
            "first such row). Token ids index the target's vocabulary: map ids from "
            "another vocabulary into it.",
        )
    ]


def uniform_problems(name, uniforms):
    # `~(0 <= u < 1)` also catches NaN.
    outside = ~((uniforms >= 0) & (uniforms < 1))
    return [
        (
            _per_row(outside),
            f"`{name}` holds a value outside [0, 1) in row {{row}} (the first such row). "
            "Draw uniforms with `jax.random.uniform(key, shape)`, which lies in [0, 1).",
        )
    ]


def stage_problem(stage, role: str, flags, returned: str, contract: str):
    """The problem of a stage that returned a value outside its contract."""
    name = type(stage).__name__
    return (
        flags,
        f"{name} (the {role}) returned {returned} in row {{row}} (the first such row). "
        f"Fix {name}: {contract}",
    )


class Checked(eqx.Module):
    """What a checked program returns: its outputs, and `status`, the index of the first
    problem found and its first offending row (`[-1, -1]` when there is none), with the
    problems' messages (static: built once per compiled program)."""

    outputs: Any  # a dict of the entry points' outputs, or a DecodeResult
    status: Int[Array, "2"]
    messages: tuple[str, ...] = eqx.field(static=True)

    def resolve(self) -> Any:
        """The outputs, or [`eqx_specdec.InvalidInputError`][] for the first problem.

        With a concrete status (the entry point called from Python: its program has
        run), raised here, at the call. With a traced one (inside a caller's
        `eqx.filter_jit`, `jax.jit` or `jax.vmap`), the check joins the caller's
        program as a branch taken only on a problem: a valid call costs one scalar
        comparison and no transfer.

        - When JAX has one device, the branch is Equinox's own
            `eqx.branched_error_if`, threaded through the outputs: an invalid call
            fails when its outputs are computed, with the same message (row included),
            as `eqx.EquinoxRuntimeError` under `eqx.filter_jit` and `jax.vmap`.
        - When JAX has several, a callback that raises inside a program stops its
            device while the others wait at their next collective (XLA aborts the
            process after 40 s; `eqx.error_if` does this too). The branch is then a
            `jax.debug.callback`, whose failure JAX reports as
            `jax.errors.JaxRuntimeError` when the outputs are read (and once more at
            the next `jax.effects_barrier()`), and the program runs to its end."""
        if not isinstance(self.status, jax.core.Tracer):
            raise_first(self.messages, self.status)
            return self.outputs
        if jax.device_count() == 1:
            return eqx.branched_error_if(
                self.outputs,
                self.status[0] >= 0,
                self.status[0] * _ROWS + self.status[1],
                RowMessages(self.messages),
            )
        jax.lax.cond(
            self.status[0] >= 0,
            lambda status: jax.debug.callback(
                functools.partial(raise_first, self.messages), status
            ),
            lambda status: None,
            self.status,
        )
        return self.outputs


# The rows a traced check's message can name: Equinox's messages are chosen by one
# integer, here the problem's index times this plus its row.
_ROWS = 1 << 24


class RowMessages(Sequence):
    """The messages of `eqx.branched_error_if` for `templates` (with a `{row}` field):
    message `i` is template `i // _ROWS` naming row `i % _ROWS`. Immutable and hashable
    (Equinox holds it as a static argument); formatted only when an error is raised."""

    def __init__(self, templates: tuple[str, ...]):
        self._templates = tuple(templates)

    def __len__(self) -> int:
        return len(self._templates) * _ROWS

    def __getitem__(self, index):
        problem, row = divmod(int(index), _ROWS)
        return self._templates[problem].format(row=row)

    def __hash__(self) -> int:
        return hash(self._templates)

    def __eq__(self, other) -> bool:
        return isinstance(other, RowMessages) and other._templates == self._templates


def raise_first(messages, status):
    """Raises [`eqx_specdec.InvalidInputError`][] for the first problem of `status`
    (of any leading batch shape), if any."""
    status = np.asarray(status).reshape(-1, 2)
    for problem, row in status:
        if problem >= 0:
            raise InvalidInputError(messages[int(problem)].format(row=int(row)))


def checked(outputs, problems) -> Checked:
    """`outputs` with the status of `problems` (a list of `(flags (B,), message)`): the
    first problem in the list that occurs, and its first offending row.

    Computed as each row's first problem (one elementwise pass, which XLA fuses), then
    the least of them and the first row holding it: a few kernels whatever the number of
    problems, where stacking the flags compiles a kernel per problem."""
    return Checked(outputs, problem_status(problems), tuple(m for _, m in problems))


def problem_status(problems) -> Int[Array, "2"]:
    """The status of `problems` (see `checked`): the index of the first problem that
    occurs and its first offending row, `[-1, -1]` if none."""
    count = len(problems)
    code = jnp.full(problems[0][0].shape, count, jnp.int32)
    for index in reversed(range(count)):
        code = jnp.where(problems[index][0], jnp.int32(index), code)
    first = jnp.min(code)
    row = jnp.argmax(code == first).astype(jnp.int32)
    return jnp.where(first < count, jnp.stack([first, row]), -1).astype(jnp.int32)


def resolved(outputs) -> Any:
    """What a compiled entry point gives its caller: a [`Checked`][] program's outputs
    (or its error, see `Checked.resolve`), other outputs as they are."""
    return outputs.resolve() if isinstance(outputs, Checked) else outputs


_MODEL_OUTPUT = (
    "`{name}` returned a distribution that is not one (a NaN or infinite value, a "
    "negative probability, or a sum not within {tol:g} of 1) for row {{row}} (the first "
    "such row), at a step of the loop. Return probabilities normalised over the "
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
        (jnp.zeros_like(active) if flags is None else flags & active, message)
        for flags, message in zip(invalid, MODEL_MESSAGES, strict=True)
    ]
