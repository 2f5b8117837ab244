"""The result of [`eqx_specdec.verify`][]: the emitted tokens, what was asked for beside
them, and a result code."""

import equinox as eqx
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._inputs.results import RESULTS


OPTIONAL_OUTPUTS = ("path", "logprobs", "raw_logprobs", "top_logprobs", "top_tokens")


class Verification(eqx.Module):
    """What one verification step emitted, as typed fields (`None` where not asked for
    or not applicable), and what its run-time checks found.

    **Fields:**

    - `num_accepted`: int32 `(B,)`, the number $n$ of accepted draft tokens (for a tree,
        the accepted path's length).
    - `tokens`: int32 `(B, G + 1)` (a tree: `(B, N + 1)`), the accepted draft tokens,
        the correction token, then -1.
    - `path`: for a tree, int32 `(B, N)`, the accepted nodes' indices, then -1 (for
        keeping their KV-cache entries); `None` for a chain.
    - `logprobs`, `raw_logprobs`, `top_logprobs`, `top_tokens`: with
        `logprobs=LogProbs(...)`, the emitted tokens' log-probabilities (see
        [`eqx_specdec.LogProbs`][]); `None` otherwise.
    - `result`: an [`eqx_specdec.RESULTS`][] member: `RESULTS.successful` when every
        run-time check passed (or checks were off), the first problem found otherwise.
    - `failed_row`: int32 scalar, the first row with that problem, -1 when there is
        none.
    - `problem`: int32 scalar, the index of that problem among the program's checks
        (-1 for none), which `error_message()` reads.
    """

    num_accepted: Int[Array, " B"]
    tokens: Int[Array, "B L"]
    path: Int[Array, "B N"] | None
    logprobs: Float[Array, "B L"] | None
    raw_logprobs: Float[Array, "B L"] | None
    top_logprobs: Float[Array, "B L k"] | None
    top_tokens: Int[Array, "B L k"] | None
    result: RESULTS
    failed_row: Int[ArrayLike, ""]
    problem: Int[ArrayLike, ""]
    messages: tuple[str, ...] = eqx.field(static=True)

    def error_message(self) -> str | None:
        """The message of the problem found (argument, problem, first row and fix), as
        `throw=True` raises it, or `None` when there is none. Reads the result on the
        host: call it outside `jax.jit`."""
        index = int(np.asarray(self.problem))
        if index < 0:
            return None
        return self.messages[index].format(row=int(np.asarray(self.failed_row)))

    def as_dict(self) -> dict[str, Array]:
        """The contract's dict: `"num_accepted"` and `"tokens"`, and each field given
        (`"path"`, the log-probabilities) under its name."""
        out = {"num_accepted": self.num_accepted, "tokens": self.tokens}
        for name in OPTIONAL_OUTPUTS:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out
