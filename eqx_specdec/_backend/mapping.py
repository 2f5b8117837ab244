"""The backend's mapping of a row's verification over the batch."""

from .._platform import (
    leading_by_kernel,
    on_cpu,
    rows_n_by_kernel,
    rows_n_by_scan,
)
from .abstract_row_mapping import AbstractRowMapping
from .row_by_row import RowByRow
from .vectorised import Vectorised


def row_mapping(
    batching: str,
    argmax_only: bool = False,
    rows_given: bool = False,
    shape: tuple = (0, 0),
) -> AbstractRowMapping:
    """The mapping `batching` names: `"map"` one row after another (`RowByRow`),
    `"vmap"` vectorised (`Vectorised`), `"pallas"` vectorised with the rows read by the
    stages' Pallas kernels (rows n by the sampler's; greedy verification's argmaxes by
    the ratio test's), and `"auto"`:

    - on the CPU, rows given as arrays (`rows_given`: probabilities, not warped
        logits) of a large batch (`shape`, `(B, V)`: `rows_n_by_scan`) vectorised, with
        rows n read by the sampler's pass one sequence after another (at
        (64, 5, 128256), 5.4 ms against 7.2 ms for the whole verification row by row);
        other rows one by one (on XLA CPU, `vmap` turns the read of row n
        of each sequence into a gather that runs 4x slower than the contiguous slice
        each iteration reads); a verifier reading each row's argmax alone
        (`argmax_only`: greedy verification) reads no row n and is vectorised (15 ms
        against 22 ms row by row);
    - on a TPU, vectorised, with rows n read by the kernel (`rows_n_by_kernel`: for
        probabilities from `ROWS_N_KERNEL_MIN_ENTRIES` entries up; warped logits
        always, their top-k and top-p cut-offs then found by the cut-off kernel), and
        from `LEADING_KERNEL_MIN_ENTRIES` entries a position (`leading_by_kernel`)
        the kernels that read each sequence's rows up to its first failure: greedy
        verification's argmaxes, and warped logits' cut-offs and normalisers under a
        threshold rule;
    - elsewhere vectorised."""
    if batching == "map":
        return RowByRow()
    if batching == "vmap":
        return Vectorised()
    if batching == "pallas":
        return Vectorised(passes="kernel")
    if on_cpu():
        if argmax_only:
            return Vectorised()
        if rows_given and rows_n_by_scan(*shape):
            return Vectorised(passes="scan")
        return RowByRow()
    leading = leading_by_kernel(*shape)
    if argmax_only:
        return Vectorised(passes="kernel" if leading else "in each row")
    kernel = rows_n_by_kernel(*shape, rows_given)
    return Vectorised(passes="kernel" if kernel else "in each row", leading=leading)
