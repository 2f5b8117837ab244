"""Mapping the verification of one row over the batch with `jax.vmap`, the fast form
on accelerators."""

import jax

from .._stages.row_fields import with_row_values
from .._warps.warp import as_log_probs, as_normalised
from .abstract_row_mapping import AbstractRowMapping, with_test


class Vectorised(AbstractRowMapping):
    """Rows verified under `jax.vmap`. A search's branches would become selects running
    both: the warps' cut-offs and normalisers are found for the whole batch first, and
    an optimisation barrier holds them and the logits as computed before the map
    (without it, a program on top-k or top-p rows compiled but never returned on a TPU
    v5e with JAX 0.10.2, nor with a barrier over the per-row fields alone)."""

    def __call__(self, verifier, row, values, inputs, until_failure):
        del until_failure  # every row is evaluated whole
        inputs = tuple(as_normalised(a) for a in inputs)
        inputs = jax.lax.optimization_barrier(inputs)

        def one(row_values, *arrays):
            test = with_row_values(verifier.ratio_test, row_values)
            return row(
                with_test(verifier, row_values, test),
                *(as_log_probs(a) for a in arrays),
            )

        return jax.vmap(one)(values, *inputs)
