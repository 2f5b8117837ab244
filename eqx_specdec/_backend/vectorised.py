"""Mapping the verification of one row over the batch with `jax.vmap`, the fast form
on accelerators."""

from typing import Literal

import equinox as eqx
import jax

from .._platform import on_tpu, rows_n_by_kernel
from .._stages.row_fields import with_row_values
from .._warps.warp import as_log_probs, as_normalised
from .abstract_row_mapping import (
    AbstractRowMapping,
    draft_token_values,
    Verification,
    with_test,
)
from .rows_n_kernel import kernel_applies, read_rows_n, rule_applies


class Vectorised(AbstractRowMapping):
    """Rows verified under `jax.vmap`. A search's branches would become selects running
    both: the warps' cut-offs and normalisers are found for the whole batch first, and
    an optimisation barrier holds them and the logits as computed before the map
    (without it, a program on top-k or top-p rows compiled but never returned on a TPU
    v5e with JAX 0.10.2, nor with a barrier over the per-row fields alone).

    With `rows_n_kernel` (`"always"`, or `"long rows"` where `rows_n_by_kernel` says),
    where the kernel computes what the sampler would
    (`rows_n_kernel.kernel_applies`), the verification runs in three phases: the ratio
    test and counter of every row (`decide_row`), then one Pallas kernel reading rows n
    of the batch, then the sampler and assembler of every row, reading the kernel's
    block totals. Under `vmap` alone, XLA reads rows n through a gather (on a TPU v5e,
    five times the kernel's time at (64, 5, 128256))."""

    rows_n_kernel: Literal["never", "always", "long rows"] = eqx.field(
        static=True, default="never"
    )

    def __call__(self, verifier, row, values, inputs, verification):
        inputs = tuple(as_normalised(a) for a in inputs)
        inputs = jax.lax.optimization_barrier(inputs)

        taken = None
        if verification is not None:
            taken = draft_token_values(verifier, *inputs[:3])

        def one(row_values, arrays, **more):
            test = with_row_values(verifier.ratio_test, row_values)
            if more.get("taken") is None:
                more.pop("taken", None)
            return row(
                with_test(verifier, row_values, test),
                *(as_log_probs(a) for a in arrays),
                **more,
            )

        tokens, draft, target = inputs[:3]
        kernel = self.rows_n_kernel == "always" or (
            self.rows_n_kernel == "long rows" and rows_n_by_kernel(target.shape[-1])
        )
        if kernel and verification is not None:
            if kernel_applies(verifier, draft, target, verification.context.log_space):
                return self._in_phases(
                    verifier, one, values, inputs, taken, verification
                )
        return jax.vmap(lambda v, a, t: one(v, a, taken=t))(values, inputs, taken)

    @staticmethod
    def _in_phases(verifier, one, values, inputs, taken, verification: Verification):
        def decide(row_values, arrays, taken):
            test = with_row_values(verifier.ratio_test, row_values)
            one_verifier = with_test(verifier, row_values, test)
            return verification.decide(one_verifier, *arrays, taken=taken)

        verdict, n = eqx.filter_vmap(decide)(values, inputs[:4], taken)
        rows_n = None
        if rule_applies(verdict):
            rows_n = read_rows_n(
                n,
                verdict,
                *inputs[:3],
                checked=verification.values,
                interpret=not on_tpu(),
            )

        def finish(row_values, arrays, taken, verdict, n, rows_n):
            more = dict(taken=taken, decided=(verdict, n), rows_n=rows_n)
            return one(row_values, arrays, **more)

        return eqx.filter_vmap(finish)(values, inputs, taken, verdict, n, rows_n)
