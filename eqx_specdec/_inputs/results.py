"""The result of a checked program: [`eqx_specdec.RESULTS`][], one member per problem
the run-time checks find, and how a program raises the first problem it found.

A check is a `Problem`: per-row flags `(B,)`, its member of `RESULTS`, and its message
as this program words it (the argument as the input names it, the user's stage class,
the vocabulary size), with a `{row}` field. The program finds the first problem in
the list that occurs and its first row, gives the member and the row to the caller,
and, when asked to throw, raises inside itself with Equinox's `branched_error_if`.
"""

import functools
import os
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Int


class RESULTS(eqx.Enumeration):
    """What a verification's run-time checks found: `successful`, or the first problem.

    [`eqx_specdec.Verification`][]`.result` (and
    [`eqx_specdec.DecodeResult`][]`.result`) holds one member, a traced value: compare
    it with `verification.result == RESULTS.not_normalised`, and read the first row
    with that problem from `failed_row`. Raised as an error (`throw=True`, the
    default), the message also names the argument (or the stage's class), the row and
    the fix. `RESULTS[member]` gives the member's message below.
    """

    successful = ""
    token_out_of_range = (
        "A token id lies outside the target's vocabulary [0, V): token ids index the "
        "target's vocabulary."
    )
    uniform_out_of_range = (
        "A uniform lies outside [0, 1): draw uniforms with `jax.random.uniform`."
    )
    invalid_probability = (
        "A distribution holds a NaN, infinite or negative probability: pass "
        "probabilities >= 0, a softmax of finite logits."
    )
    not_normalised = (
        "A distribution does not sum to 1 within the tolerance of its dtype (1e-3; "
        "1e-2 for 16-bit floats): normalise over the vocabulary."
    )
    invalid_logit = "A logit is NaN or +inf: mask a token with -inf."
    all_masked = (
        "Every logit of a distribution is -inf (masked, or banned by a logit bias): "
        "leave at least one token of each distribution."
    )
    invalid_warp = (
        "A warp's parameter lies outside its range (temperature >= 0, top_p in (0, 1], "
        "top_k >= 0, min_p in [0, 1], logit bias not NaN or +inf)."
    )
    invalid_mask = (
        "`allowed` leaves a position with no token, or the target gives no "
        "probability to the tokens it allows."
    )
    invalid_tree = (
        "`parents` is not in depth-first order, or describes a tree deeper than the "
        "verifier walks."
    )
    invalid_stage_output = (
        "A stage returned a value outside its contract (a number accepted outside "
        "[0, G], a correction token outside [0, V), tokens not laid out as the contract "
        "says, a non-finite residual scale)."
    )
    not_exact = (
        "A threshold rule declared exact accepted more of a token than the target "
        "holds, min(q, t) > p, where its correction is drawn: the verifier is not "
        "exact."
    )
    invalid_model_output = (
        "A model of the decoding loop returned a distribution that is not one (NaN, "
        "infinite, negative, or not normalised)."
    )


class Problem(eqx.Module):
    """One run-time check of a verification step, as
    [`eqx_specdec.families.verification_step`][] returns them.

    **Fields:**

    - `flags`: bool `(B,)`, the rows where the problem occurs.
    - `result`: its member of [`eqx_specdec.RESULTS`][].
    - `message`: what the error says, naming the argument (or the stage), the problem
        and the fix, with a `{row}` field for the first row flagged.
    """

    flags: Bool[Array, " B"]
    result: RESULTS
    message: str = eqx.field(static=True)


class Status(eqx.Module):
    """The first problem found in a program: its index in the program's list (-1 for
    none), its member of `RESULTS`, its first row (-1 for none), and the list's
    messages (static)."""

    index: Int[ArrayLike, ""]
    result: RESULTS
    row: Int[ArrayLike, ""]
    messages: tuple[str, ...] = eqx.field(static=True)


def status_of(problems: list[Problem]) -> Status:
    """The first problem in `problems` that occurs, and its first row.

    Computed as each row's first problem (one elementwise pass, which XLA fuses), then
    the least of them and the first row holding it: a few kernels whatever the number
    of problems."""
    if not problems:  # constants, so that the program is the verifier's own
        return Status(np.int32(-1), RESULTS.successful, np.int32(-1), ())
    count = len(problems)
    code = jnp.full(problems[0].flags.shape, count, jnp.int32)
    for index in reversed(range(count)):
        code = jnp.where(problems[index].flags, jnp.int32(index), code)
    first = jnp.min(code)
    found = first < count
    index = jnp.where(found, first, -1).astype(jnp.int32)
    row = jnp.where(found, jnp.argmax(code == first), -1).astype(jnp.int32)
    # The member as one lookup in a table of the members' values (a pytree leaf each),
    # not a chain of `RESULTS.where`: a few operations whatever the number of problems.
    table = [_value(problem.result) for problem in problems]
    table = jnp.asarray(np.array(table + [_value(RESULTS.successful)], np.int32))
    value = table[jnp.where(found, first, count)]
    result = jax.tree.map(lambda _: value, RESULTS.successful)
    messages = tuple(problem.message for problem in problems)
    return Status(index, result, row, messages)


def _value(member: RESULTS) -> int:
    """The integer a member of `RESULTS` holds (its one pytree leaf)."""
    (leaf,) = jax.tree.leaves(member)
    return int(leaf)


def first_of(old: Status, new: Status) -> Status:
    """`old` when it holds a problem, `new` otherwise (the same program's list)."""
    keep = old.index >= 0
    return Status(
        jnp.where(keep, old.index, new.index),
        RESULTS.where(keep, old.result, new.result),
        jnp.where(keep, old.row, new.row),
        new.messages,
    )


class _RowMessages(Sequence):
    """The messages of `eqx.branched_error_if` for a program's problems over `batch`
    rows: message `i` is problem `i // batch`'s, naming row `i % batch` (one per
    problem and row, formatted only when an error is raised). Immutable and hashable:
    Equinox holds it as static."""

    def __init__(self, templates: tuple[str, ...], batch: int):
        self._templates = tuple(templates)
        self._batch = max(1, int(batch))

    def __len__(self) -> int:
        return len(self._templates) * self._batch

    def __getitem__(self, index):
        problem, row = divmod(int(index), self._batch)
        return self._templates[problem].format(row=row)

    def __hash__(self) -> int:
        return hash((self._templates, self._batch))

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, _RowMessages)
            and other._templates == self._templates
            and other._batch == self._batch
        )


def _raise(messages, index, row):
    # The host side of the several-device branch (under `vmap`, a batch of statuses).
    for i, r in zip(np.ravel(index), np.ravel(row), strict=True):
        if i >= 0:
            raise RuntimeError(messages[int(i)].format(row=int(r)))


def raise_if_failed(outputs, status: Status, batch: int):
    """`outputs`, joined to a branch of the program that raises `status`'s problem,
    taken only when there is one: a valid call sends nothing to the host and waits on
    nothing. `EQX_ON_ERROR` says what a problem does, as for every Equinox error.

    - With one device, Equinox's `eqx.branched_error_if`, threaded through the
        outputs: `eqx.EquinoxRuntimeError` from the library's entry points and under
        `eqx.filter_jit` and `jax.vmap`; JAX's `JaxRuntimeError` inside a caller's
        plain `jax.jit`, except through JAX's fast dispatch (a later call on NumPy
        inputs), which raises a failed callback as `ValueError` (JAX 0.10.2).
    - With several devices, an error raised inside a program stops its device while
        the others wait at their next collective, and XLA aborts the process (as it
        does for `eqx.error_if`): the branch is a `jax.debug.callback`, whose failure
        JAX raises as `JaxRuntimeError` when the outputs are read.
        (A debug callback is an effect, and a program with one leaves JAX's fast
        dispatch: at (16, 5, 32000) on the CPU the default call cost 1.44x the
        unchecked one with it, 1.07x with Equinox's branch, so one device keeps the
        latter.)

    In a job of several processes, a callback runs in one process only, and raising
    there would leave the others waiting: the branch is off, and `raise_on_host` raises
    in every process from the result, which every process holds."""
    if not status.messages or jax.process_count() > 1:
        return outputs
    failed = status.index >= 0
    if jax.device_count() == 1:
        index = jnp.maximum(status.index, 0) * batch + jnp.maximum(status.row, 0)
        messages = _RowMessages(status.messages, batch)
        return eqx.branched_error_if(outputs, failed, index, messages)
    if os.environ.get("EQX_ON_ERROR", "raise") == "nan":
        return outputs
    jax.lax.cond(
        jnp.any(failed),
        lambda i, r: jax.debug.callback(
            functools.partial(_raise, status.messages), i, r
        ),
        lambda i, r: None,
        status.index,
        status.row,
    )
    return outputs


def raise_on_host(verification):
    """In a job of several processes, raises `verification`'s problem in every process
    (it reads the result, which every process holds: the call waits for it); nothing
    otherwise, where the program raised it itself (`raise_if_failed`)."""
    if jax.process_count() == 1 or isinstance(verification.problem, jax.core.Tracer):
        return
    if os.environ.get("EQX_ON_ERROR", "raise") == "nan":
        return
    found = verification.error_message()
    if found is not None:
        raise RuntimeError(found)
