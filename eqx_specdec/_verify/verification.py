"""The result of [`eqx_specdec.verify`][]: the emitted tokens, what was asked for beside
them, and a result code."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .checks import Checked, raise_first


_OPTIONAL = ("path", "logprobs", "raw_logprobs", "top_logprobs", "top_tokens")


class Verification(eqx.Module):
    """What one verification step emitted, as typed fields (`None` where not asked for
    or not applicable), and its result code.

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
    - `result`: int32 scalar, the result code: 0 when every run-time check passed (or
        checks were off), $k > 0$ when the first problem found is the $k$-th of the
        program's checks (`error_message()` says which).
    - `failed_row`: int32 scalar, the first row with that problem, -1 when `result`
        is 0.
    """

    num_accepted: Int[Array, " B"]
    tokens: Int[Array, "B L"]
    path: Int[Array, "B N"] | None
    logprobs: Float[Array, "B L"] | None
    raw_logprobs: Float[Array, "B L"] | None
    top_logprobs: Float[Array, "B L k"] | None
    top_tokens: Int[Array, "B L k"] | None
    result: Int[ArrayLike, ""]
    failed_row: Int[ArrayLike, ""]
    messages: tuple[str, ...] = eqx.field(static=True)

    def error_message(self) -> str | None:
        """The message of the problem `result` names (argument, problem, first row and
        fix), or `None` when `result` is 0. Reads `result` and `failed_row` on the
        host: call it outside `jax.jit`."""
        code = int(np.asarray(self.result))
        if code == 0:
            return None
        return self.messages[code - 1].format(row=int(np.asarray(self.failed_row)))

    def as_dict(self) -> dict[str, Array]:
        """The contract's dict: `"num_accepted"` and `"tokens"`, and each field given
        (`"path"`, the log-probabilities) under its name."""
        out = {"num_accepted": self.num_accepted, "tokens": self.tokens}
        for name in _OPTIONAL:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


def verification_of(outputs) -> Verification:
    """A [`eqx_specdec.Verification`][] from what a step returned: its outputs' dict,
    or a [`Checked`][eqx_specdec._verify.checks.Checked] holding it."""
    if isinstance(outputs, Checked):
        status, messages, outputs = outputs.status, outputs.messages, outputs.outputs
        result, row = (status[0] + 1).astype(jnp.int32), status[1].astype(jnp.int32)
    else:  # unchecked: constants, so that the program is the verifier's own
        result, row, messages = np.int32(0), np.int32(-1), ()
    return Verification(
        num_accepted=outputs["num_accepted"],
        tokens=outputs["tokens"],
        **{name: outputs.get(name) for name in _OPTIONAL},
        result=result,
        failed_row=row,
        messages=messages,
    )


def resolved_verification(verification: Verification, throw: bool) -> Verification:
    """`verification` as the caller gets it: with `throw`, its checks raised (at the
    call) or joined to the caller's program (see
    [`Checked.resolve`][eqx_specdec._verify.checks.Checked.resolve])."""
    if not throw or not verification.messages:
        return verification
    if isinstance(verification.result, jax.core.Tracer):
        status = jnp.stack([verification.result - 1, verification.failed_row])
        return Checked(verification, status, verification.messages).resolve()
    # Called from Python: one transfer of the two integers, no further operation.
    result, row = jax.device_get((verification.result, verification.failed_row))
    raise_first(verification.messages, np.asarray([result - 1, row]))
    return verification
