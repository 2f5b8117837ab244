"""Tools that measure the distribution a verifier emits, to show it is lossless."""

import equinox as eqx

from .emission import EmissionEstimate
from .families import evaluation_family


def emission_by_quadrature(
    verifier: eqx.Module,
    draft_probs,
    target_probs,
    *,
    draft_law=None,
    log_inputs: bool | None = None,
    accept_breakpoints=None,
    sample_breakpoints=None,
    subdivisions: int | None = None,
    chunk_size: int = 1 << 16,
) -> EmissionEstimate:
    """Computes, by deterministic quadrature over the uniforms, how often `verifier`
    emits each token at each position, for one row with fixed distributions.

    The verifier is a deterministic function of the draft tokens $x$ and the uniforms
    $(u_0, \\dots, u_{G-1}, s)$. This evaluates it on every draft sequence (weighted by its
    probability under `draft_law`) and on a stratified grid of uniforms (weighted by cell
    volume). The grid's cells in $u_i$ are bounded by the ratios $p_i(v) / q_i(v)$, and in
    $s$ by the cumulative sums of every standard residual, and by the breakpoints the
    verifier's stages declare (their `quadrature_breakpoints` capability, e.g.
    $p_i(v) / (l\\, q_i(v))$ for a lenient test), each cell split into `subdivisions`
    parts: the result is then exact up to float rounding. A stage that does not
    implement `quadrature_breakpoints` raises [`eqx_specdec.MissingCapabilityError`][],
    unless you pass the breakpoints yourself.

    With a tree verifier ([`eqx_specdec.TreeVerifier`][] built with its `tree`), the
    draft is that tree: every
    assignment of tokens to its nodes is enumerated (drawn by the node rule's
    `candidate_law`), and the cells are cut at the node rule's `pass_threshold` at every
    reachable state and at the cumulative sums of every final residual; positions are
    then the tree's contexts (see [`eqx_specdec.evaluation.EmissionEstimate`][]). A tree's
    evaluation takes none of `draft_law`, `log_inputs`, the breakpoints and
    `subdivisions` (a `ValueError` names any given).

    Cost: $V^G \\cdot (\\#u\\text{ cells})^G \\cdot \\#s\\text{ cells}$ verifier rows, so for
    small cases ($V \\le 8$, $G \\le 3$; trees of a few nodes over $V \\le 4$).

    **Arguments:**

    - `verifier`: the [`eqx_specdec.Verifier`][] (or [`eqx_specdec.TreeVerifier`][]) to
        measure.
    - `draft_probs`: `(G, V)`, the draft distributions $q_i$ given to the verifier, or
        `None` for one-hot drafts. For a tree, `(N + 1, V)`: row 0 at the root, row
        $i + 1$ after node $i$ (the law node $i$'s children are drafted from).
    - `target_probs`: `(G + 1, V)` (for a tree, `(N + 1, V)`), the target
        distributions.
    - `draft_law`: `(G, V)`, the law the draft tokens are drawn from. Defaults to
        `draft_probs`; required when `draft_probs` is `None`.
    - `log_inputs`: pass $\\log q$ and $\\log p$ to the verifier (its stages then
        get a [`eqx_specdec.RowContext`][] of log-probabilities, as for
        [`eqx_specdec.Logits`][]). Default `None`: probabilities.
    - `accept_breakpoints`: `(G, K)`, further values of $u_i$ where the verifier's
        outcome may change, beyond those its stages declare.
    - `sample_breakpoints`: `(K,)`, further values of $s$ where the sampled token may
        change.
    - `subdivisions`: grid points per cell and axis. Default 2.
    - `chunk_size`: verifier rows per compiled call.

    **Returns:**

    An [`eqx_specdec.evaluation.EmissionEstimate`][] of probabilities.
    """
    return evaluation_family(verifier).quadrature(
        draft_probs,
        target_probs,
        draft_law=draft_law,
        log_inputs=log_inputs,
        accept_breakpoints=accept_breakpoints,
        sample_breakpoints=sample_breakpoints,
        subdivisions=subdivisions,
        chunk_size=chunk_size,
    )


def emission_by_monte_carlo(
    verifier: eqx.Module,
    draft_probs,
    target_probs,
    key,
    num_draws: int,
    *,
    draft_law=None,
    log_inputs: bool | None = None,
    chunk_size: int = 16_384,
) -> EmissionEstimate:
    """Counts, over `num_draws` random steps, how often `verifier` emits each token at
    each position, for one row with fixed distributions.

    Each draw samples the draft tokens $x_i$ from `draft_law` (inverse CDF) and the
    float32 uniforms $u_i$, $s$ with `jax.random.uniform` (for a key-driven sampler, one
    key per draw instead of $s$), all from `key`: the same key gives the same counts. Pair with [`eqx_specdec.evaluation.EmissionEstimate.chi_square`][].

    **Arguments:**

    - `verifier`: the [`eqx_specdec.Verifier`][] to measure, or a tree verifier
        built with its `tree` ([`eqx_specdec.TreeVerifier`][]): the distributions are
        then `(N + 1, V)` as for [`eqx_specdec.evaluation.emission_by_quadrature`][], and each
        draw drafts the tree with the node rule's `candidate_law`.
    - `draft_probs`: `(G, V)`, or `None` for one-hot drafts.
    - `target_probs`: `(G + 1, V)`.
    - `key`: a `jax.random` key.
    - `num_draws`: the number of verification steps to simulate.
    - `draft_law`: `(G, V)`, the law of the draft tokens; defaults to `draft_probs`.
    - `log_inputs`: pass $\\log q$ and $\\log p$ to the verifier. Default: whether its
        stages read log-probabilities.
    - `chunk_size`: draws per compiled call.

    **Returns:**

    An [`eqx_specdec.evaluation.EmissionEstimate`][] of counts.
    """
    return evaluation_family(verifier).monte_carlo(
        draft_probs,
        target_probs,
        key,
        num_draws,
        draft_law=draft_law,
        log_inputs=log_inputs,
        chunk_size=chunk_size,
    )
