"""The backend's mapping of a row's verification over the batch."""

from .._platform import on_cpu, rows_n_by_kernel
from .abstract_row_mapping import AbstractRowMapping
from .row_by_row import RowByRow
from .vectorised import Vectorised


def row_mapping(
    batching: str, argmax_only: bool = False, rows_given: bool = False, vocab: int = 0
) -> AbstractRowMapping:
    """The mapping `batching` names: `"map"` one row after another (`RowByRow`),
    `"vmap"` vectorised (`Vectorised`), `"pallas"` vectorised with rows n read by the
    sampler's Pallas kernel, and `"auto"`:

    - on the CPU, rows given as arrays (`rows_given`: probabilities, not warped
        logits) vectorised, with rows n read by the sampler's pass one sequence after
        another (at (64, 5, 128256), 4.8 ms against 6.4 ms for the whole verification
        row by row); other rows one by one (on XLA CPU, `vmap` turns the read of row n
        of each sequence into a gather that runs 4x slower than the contiguous slice
        each iteration reads); a verifier reading each row's argmax alone
        (`argmax_only`: greedy verification) reads no row n and is vectorised (15 ms
        against 22 ms row by row);
    - on a TPU, vectorised, with rows n read by the kernel from `KERNEL_MIN_VOCAB`
        entries up (`rows_n_by_kernel`);
    - elsewhere vectorised."""
    if batching == "map":
        return RowByRow()
    if batching == "vmap":
        return Vectorised()
    if batching == "pallas":
        return Vectorised(rows_n="kernel")
    if on_cpu():
        if argmax_only:
            return Vectorised()
        return Vectorised(rows_n="scan") if rows_given else RowByRow()
    return Vectorised(rows_n="kernel" if rows_n_by_kernel(vocab) else "in each row")
