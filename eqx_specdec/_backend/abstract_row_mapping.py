"""The seam between a verifier and the backend it runs on: how one row's verification
is mapped over the batch."""

import abc
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax

from .._stages.row_context import RowContext
from .._warps.warp import at_draft_tokens, NormalisedRows


class RowVerification(NamedTuple):
    """Says that a mapping's `row` is the verification of its inputs, in order
    (`verify_row`), with this `context`, reporting the checks' values when `values`;
    `decide(verifier, tokens, draft, target, accept)` runs its first phase alone (the
    ratio test and counter: `(verdict, n)`), which `row` then takes as
    `decided=`; `stages_fit`: whether the verifier's counter and sampler fit its ratio
    test (what a test's batch pass, such as `argmax_pass`, assumes); `checked`: whether
    `row` reports for the run-time checks (and takes `normalisers=`, from
    `row_normalisers`)."""

    context: RowContext
    values: bool
    decide: Callable
    stages_fit: bool = False
    checked: bool = False


class AbstractRowMapping(eqx.Module):
    """Maps the verification of one row over the batch.

    `__call__(verifier, row, values, inputs, verification)`: `row(verifier, *arrays)`
    on every row of `inputs` (arrays with a leading batch axis, warped rows
    unevaluated), each row's verifier holding the ratio test's per-row field values
    `values` of that row. `verification`: a `RowVerification` when `row` is the
    verification of `inputs`, in order, so that a mapping may skip what cannot change
    its outputs, or run its stages in phases (else `None`).
    """

    @abc.abstractmethod
    def __call__(
        self, verifier, row, values, inputs, verification: RowVerification | None
    ):
        raise NotImplementedError


def with_test(verifier, values, test):
    """`verifier` with its ratio test `test` (holding one row's per-row field values),
    or `verifier` itself when the test has none."""
    if not values:
        return verifier
    return eqx.tree_at(lambda v: v.ratio_test, verifier, test)


def draft_token_values(verifier, tokens, draft, target):
    """The draft tokens' values of every sequence, `(p_x, q_x)` `(B, G)` (`q_x` `None`
    for one-hot drafts), gathered with the batch's for a test declaring it reads only
    them, on rows given as arrays or as normalised warped rows (each value computed as
    the row's evaluation computes it, `NormalisedRows.at_tokens`); else `None`.
    `RowContext.gather` returns a sequence's row of them. One gather of the batch's
    (b, i, x) points: XLA CPU ran the gather of a row's $2G$ values, fused inside each
    iteration of a map, at 16 us a sequence (at (256, 8, 32000), a third of the step),
    and XLA TPU ran `take_along_axis` under `vmap` 8x slower than this gather (0.91
    against 0.11 ms at (256, 8, 32000))."""
    if verifier.ratio_test.reads != "draft tokens":
        return None
    if not all(
        a is None or isinstance(a, jax.Array | NormalisedRows) for a in (draft, target)
    ):
        return None

    def take(array):
        if isinstance(array, NormalisedRows):
            return array.at_tokens(tokens)
        return at_draft_tokens(array, tokens)

    return take(target), None if draft is None else take(draft)


def stops_at_failure(verifier) -> bool:
    """Whether warped rows may be normalised only up to the first position whose
    test fails: nothing after it changes the outputs (the test is `causal`, the
    counter counts up to the first failure), and calling the test once per position
    costs little (it reads only the draft tokens' values)."""
    test = verifier.ratio_test
    return (
        test.causal
        and test.reads == "draft tokens"
        and verifier.prefix_counter.counts == "first failure"
    )


def row_normalisers(arrays) -> tuple | None:
    """One row's `(target, draft)` log-normalisers `(G + 1,)` and `(G,)` (or `None` for
    one-hot drafts), as the warp found them, from its verification arrays `(tokens,
    draft, target, ...)` where both are normalised warped rows; else `None`. A row's is
    NaN where one of its logits is NaN, $+\\infty$ where one is $+\\infty$ (or where
    the row was never read), $-\\infty$ where every logit is $-\\infty$, and finite
    otherwise: what the default checks read of the rows the verification read."""
    draft, target = arrays[1], arrays[2]

    def of(rows):
        return rows.log_sum[..., 0] if isinstance(rows, NormalisedRows) else None

    if of(target) is None or (draft is not None and of(draft) is None):
        return None
    return of(target), None if draft is None else of(draft)
