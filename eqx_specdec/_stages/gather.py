"""Gathering the draft tokens' probabilities of one row, for the ratio tests."""

import jax.numpy as jnp

from .._custom_types import DraftProbsRow, DraftTokensRow, TargetProbsRow
from .._misc import compute_dtype


def gather_draft_probs(
    draft_tokens: DraftTokensRow,
    draft_probs: DraftProbsRow | None,
    target_probs: TargetProbsRow,
    *,
    log_space: bool = False,
):
    """Gathers $p_i(x_i)$ and $q_i(x_i)$ for every draft position of one row.

    With `draft_probs=None` (one-hot drafts, $q_i = \\mathrm{onehot}(x_i)$), $q_i(x_i) = 1$
    (0 in log space). Both are returned in the row's compute dtype (at least float32).

    **Arguments:**

    - `draft_tokens`, `draft_probs`, `target_probs`: one row, as a ratio test gets them.
    - `log_space`: whether the distributions are log-probabilities.

    **Returns:**

    `(p_x, q_x)`, two float arrays of shape `(G,)`.
    """
    index = draft_tokens[:, None]
    p_x = jnp.take_along_axis(target_probs[:-1], index, axis=1)[:, 0]
    if draft_probs is None:
        dtype = compute_dtype(target_probs.dtype)
        q_x = jnp.full(p_x.shape, 0.0 if log_space else 1.0, dtype)
    else:
        dtype = compute_dtype(target_probs.dtype, draft_probs.dtype)
        q_x = jnp.take_along_axis(draft_probs, index, axis=1)[:, 0]
    return p_x.astype(dtype), q_x.astype(dtype)
