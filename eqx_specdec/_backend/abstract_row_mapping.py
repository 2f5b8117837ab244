"""The seam between a verifier and the backend it runs on: how one row's verification
is mapped over the batch."""

import abc

import equinox as eqx


class AbstractRowMapping(eqx.Module):
    """Maps the verification of one row over the batch.

    `__call__(verifier, row, values, inputs, until_failure)`: `row(verifier, *arrays)`
    on every row of `inputs` (arrays with a leading batch axis, warped rows unevaluated),
    each row's verifier holding the ratio test's per-row field values `values` of that
    row. `until_failure`: `row` is the verification of `inputs`, in order, so a mapping
    may skip what cannot change its outputs.
    """

    @abc.abstractmethod
    def __call__(self, verifier, row, values, inputs, until_failure: bool):
        raise NotImplementedError


def with_test(verifier, values, test):
    """`verifier` with its ratio test `test` (holding one row's per-row field values),
    or `verifier` itself when the test has none."""
    if not values:
        return verifier
    return eqx.tree_at(lambda v: v.ratio_test, verifier, test)
