"""Mapping the verification of one row over the batch with `jax.vmap`, the fast form
on accelerators."""

from typing import Literal

import equinox as eqx
import jax

from .._capabilities import has_capability
from .._stages.row_fields import with_row_values
from .._warps.warp import as_log_probs, as_normalised
from .abstract_row_mapping import (
    AbstractRowMapping,
    draft_token_values,
    with_test,
)


class Vectorised(AbstractRowMapping):
    """Rows verified under `jax.vmap`. A search's branches would become selects running
    both: the warps' cut-offs and normalisers are found for the whole batch first, and
    an optimisation barrier holds them and the logits as computed before the map
    (without it, a program on top-k or top-p rows compiled but never returned on a TPU
    v5e with JAX 0.10.2, nor with a barrier over the per-row fields alone).

    `rows_n`: who reads rows n for a sampler with the `rows_n_pass` capability, when
    `row` is the verification: `"in each row"` (the sampler, inside the map), or the
    sampler's pass for the whole batch, `"kernel"` (its kernel form: a Pallas kernel
    reading them by DMA) or `"scan"` (one sequence after another). With either of the
    last two the verification runs in three phases: the ratio test and counter of every
    row (`RowVerification.decide`), then the pass, then the draw and assembly of every
    row.
    """

    rows_n: Literal["in each row", "kernel", "scan"] = eqx.field(
        static=True, default="in each row"
    )

    def __call__(self, verifier, row, values, inputs, verification):
        inputs = tuple(as_normalised(a) for a in inputs)
        inputs = jax.lax.optimization_barrier(inputs)
        taken = None
        if verification is not None:
            taken = draft_token_values(verifier, *inputs[:3])

        def one(row_values, arrays, **more):
            test = with_row_values(verifier.ratio_test, row_values)
            return row(
                with_test(verifier, row_values, test),
                *(as_log_probs(a) for a in arrays),
                **more,
            )

        sampler = verifier.residual_sampler
        if (
            self.rows_n != "in each row"
            and verification is not None
            and has_capability(sampler, "rows_n_pass")
        ):
            return self._in_phases(verifier, one, values, inputs, taken, verification)
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
            kernel=self.rows_n == "kernel",
        )

        def finish(row_values, arrays, taken, verdict, n, rows_n):
            more = dict(taken=taken, decided=(verdict, n), rows_n=rows_n)
            return one(row_values, arrays, **more)

        return eqx.filter_vmap(finish)(values, inputs, taken, verdict, n, rows_n)
