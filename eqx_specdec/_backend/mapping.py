"""The backend's mapping of a row's verification over the batch."""

from .._platform import on_cpu
from .abstract_row_mapping import AbstractRowMapping
from .row_by_row import RowByRow
from .vectorised import Vectorised


def row_mapping(batching: str) -> AbstractRowMapping:
    """The mapping `batching` names: `"map"` one row after another (`RowByRow`),
    `"vmap"` vectorised (`Vectorised`), `"auto"` the first on the CPU and the second
    elsewhere. On XLA CPU, `vmap` turns the read of row n of each sequence into a
    gather that runs 4x slower than the contiguous slice each iteration reads; on
    accelerators `vmap` is the fast one."""
    if batching == "auto":
        batching = "map" if on_cpu() else "vmap"
    return RowByRow() if batching == "map" else Vectorised()
