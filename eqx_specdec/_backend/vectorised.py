"""Mapping the verification of one row over the batch with `jax.vmap`, the fast form
on accelerators."""

from typing import Literal

import equinox as eqx
import jax

from .._capabilities import has_capability
from .._kernels import warp_cutoffs
from .._stages.row_fields import with_row_values
from .._warps.warp import as_log_probs, as_normalised
from .abstract_row_mapping import (
    AbstractRowMapping,
    draft_token_values,
    row_normalisers,
    stops_at_failure,
    with_test,
)


class Vectorised(AbstractRowMapping):
    """Rows verified under `jax.vmap`. A search's branches would become selects running
    both: the warps' cut-offs and normalisers are found for the whole batch first, and
    an optimisation barrier holds them and the logits as computed before the map
    (without it, a program on top-k or top-p rows compiled but never returned on a TPU
    v5e with JAX 0.10.2, nor with a barrier over the per-row fields alone).

    `passes`: who reads the rows the stages' batch passes read, when `row` is the
    verification: `"in each row"` (each stage, inside the map), or the stages' passes
    for the whole batch, `"kernel"` (in their kernel form: Pallas kernels reading rows
    by DMA) or `"scan"` (one sequence after another). The passes are the ratio test's
    `argmax_pass` (greedy verification: the argmaxes up to each sequence's first
    rejection) and `normalise_pass` (warped rows normalised up to each sequence's first
    failure), each in kernel form only, with stages that fit the test, and the
    sampler's `rows_n_pass`; with the latter the verification runs in three phases: the
    ratio test and counter of every row (`RowVerification.decide`), then the pass, then
    the draw and assembly of every row.

    `leading`: whether, with `passes="kernel"`, the ratio test's passes that stop at
    each sequence's first failure (`argmax_pass`, `normalise_pass`) run.
    """

    passes: Literal["in each row", "kernel", "scan"] = eqx.field(
        static=True, default="in each row"
    )
    leading: bool = eqx.field(static=True, default=True)

    def __call__(self, verifier, row, values, inputs, verification):
        kernel = self.passes == "kernel"
        test = verifier.ratio_test
        if (
            kernel
            and self.leading
            and verification is not None
            and verification.stages_fit
            and not values
            and stops_at_failure(verifier)
            and has_capability(test, "normalise_pass")
        ):
            tokens, draft, target, accept = inputs[:4]
            found = test.normalise_pass(
                tokens, draft, target, accept, verification.context, kernel=True
            )
            if found is not None:
                inputs = (tokens, *found, *inputs[3:])
        searches = warp_cutoffs.by_kernel if kernel else None
        inputs = tuple(as_normalised(a, searches) for a in inputs)
        inputs = jax.lax.optimization_barrier(inputs)
        taken = None
        if verification is not None:
            taken = draft_token_values(verifier, *inputs[:3])

        def one(row_values, arrays, **more):
            test = with_row_values(verifier.ratio_test, row_values)
            if verification and verification.checked:
                normalisers = row_normalisers(arrays)
                if normalisers is not None:
                    more["normalisers"] = normalisers
            return row(
                with_test(verifier, row_values, test),
                *(as_log_probs(a) for a in arrays),
                **more,
            )

        if verification is not None and self.passes != "in each row":
            test, sampler = verifier.ratio_test, verifier.residual_sampler
            if (
                kernel
                and self.leading
                and verification.stages_fit
                and has_capability(test, "argmax_pass")
            ):
                argmaxes = test.argmax_pass(
                    inputs[0], inputs[2], verification.context, kernel=True
                )
                if argmaxes is not None:
                    return jax.vmap(lambda v, a, m: one(v, a, argmaxes=m))(
                        values, inputs, argmaxes
                    )
            if has_capability(sampler, "rows_n_pass"):
                return self._in_phases(
                    verifier, one, values, inputs, taken, verification
                )
        if taken is None:
            return jax.vmap(one)(values, inputs)
        return jax.vmap(lambda v, a, t: one(v, a, taken=t))(values, inputs, taken)

    def _in_phases(self, verifier, one, values, inputs, taken, verification):
        def decide(row_values, arrays, taken):
            test = with_row_values(verifier.ratio_test, row_values)
            one_verifier = with_test(verifier, row_values, test)
            arrays = tuple(as_log_probs(a) for a in arrays)
            return verification.decide(one_verifier, *arrays, taken=taken)

        verdict, n = eqx.filter_vmap(decide)(values, inputs[:4], taken)
        rows_n = verifier.residual_sampler.rows_n_pass(
            n,
            verdict,
            *inputs[:3],
            verification.context,
            checked=verification.values,
            kernel=self.passes == "kernel",
        )

        def finish(row_values, arrays, taken, verdict, n, rows_n):
            more = dict(taken=taken, decided=(verdict, n), rows_n=rows_n)
            return one(row_values, arrays, **more)

        return eqx.filter_vmap(finish)(values, inputs, taken, verdict, n, rows_n)
