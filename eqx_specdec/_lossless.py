"""Tools that measure the distribution a verifier emits, to show it is lossless."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._verifier import Verifier


class EmissionEstimate(eqx.Module):
    """How often a verifier emits each token at each output position.

    Position $k$ of the output (`tokens[k]`) is *reached* when $n \\ge k$ (it holds a token,
    not `-1`). A lossless verifier emits, at every reached position $k$, a token
    distributed as $p_k$: `conditional()[k]` must equal `target_probs[k]`.

    Produced by [`eqx_specdec.emission_by_quadrature`][] (probabilities, `num_draws` is
    `None`) and [`eqx_specdec.emission_by_monte_carlo`][] (counts out of `num_draws`).

    **Arguments:**

    - `emitted`: float64 `(G + 1, V)`, the probability (quadrature) or count (Monte Carlo)
        of `tokens[k] == v`.
    - `reached`: float64 `(G + 1,)`, the probability or count of `tokens[k] != -1`,
        that is of $n \\ge k$.
    - `num_draws`: the number of Monte Carlo draws, or `None` for quadrature.
    """

    emitted: np.ndarray
    reached: np.ndarray
    num_draws: int | None = eqx.field(static=True, default=None)

    def conditional(self) -> np.ndarray:
        """The distribution of `tokens[k]` given that position $k$ is reached:
        `emitted / reached`, float64 `(G + 1, V)`; rows never reached are NaN."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.emitted / self.reached[:, None]

    def max_error(self, target_probs) -> float:
        """The largest $|\\hat P(\\text{tokens}[k] = v \\mid n \\ge k) - p_k(v)|$ over
        reached positions and all tokens.

        **Arguments:**

        - `target_probs`: `(G + 1, V)`, the target distributions $p_k$.

        **Returns:**

        A Python float.
        """
        target = np.asarray(target_probs, np.float64)
        reached = self.reached > 0
        return float(np.max(np.abs(self.conditional() - target)[reached]))

    def chi_square(self, target_probs, min_expected: float = 5.0) -> dict:
        """Pearson's chi-square statistic of the Monte Carlo counts against $p_k$, per
        output position.

        Bins whose expected count is below `min_expected` are merged (all of them into one
        bin, which joins the smallest other bin if still below `min_expected`). A token
        emitted where $p_k$ is zero makes the statistic infinite. The threshold is far in
        the tail, $\\text{df} + 10\\sqrt{2\\,\\text{df}}$ (as vLLM's tests use): a correct
        verifier exceeds it with negligible probability.

        **Arguments:**

        - `target_probs`: `(G + 1, V)`, the target distributions $p_k$.
        - `min_expected`: the smallest expected count a bin may keep.

        **Returns:**

        A dict of float64 arrays of shape `(G + 1,)`: `"statistic"`, `"df"`,
        `"threshold"` (NaN at positions never reached).

        **Raises:**

        - `ValueError`: for an estimate made by quadrature (no counts).
        """
        if self.num_draws is None:
            raise ValueError("chi_square needs Monte Carlo counts, not quadrature.")
        target = np.asarray(target_probs, np.float64)
        out = {
            k: np.full(len(self.reached), np.nan)
            for k in ("statistic", "df", "threshold")
        }
        for k, total in enumerate(self.reached):
            if total == 0:
                continue
            observed = self.emitted[k]
            expected = total * target[k] / target[k].sum()
            small = expected < min_expected
            obs = list(observed[~small])
            exp = list(expected[~small])
            if small.any():
                merged_obs, merged_exp = observed[small].sum(), expected[small].sum()
                if merged_exp < min_expected and exp:
                    i = int(np.argmin(exp))
                    obs[i] += merged_obs
                    exp[i] += merged_exp
                else:
                    obs.append(merged_obs)
                    exp.append(merged_exp)
            obs, exp = np.array(obs), np.array(exp)
            with np.errstate(divide="ignore", invalid="ignore"):
                terms = np.where(
                    exp > 0, (obs - exp) ** 2 / exp, np.where(obs > 0, np.inf, 0)
                )
            df = max(len(obs) - 1, 1)
            out["statistic"][k] = terms.sum()
            out["df"][k] = df
            out["threshold"][k] = df + 10 * np.sqrt(2 * df)
        return out


def _checked(draft_probs, target_probs, draft_law):
    target = np.asarray(target_probs, np.float64)
    if target.ndim != 2:
        raise ValueError(
            f"`target_probs` must have shape (G+1, V) (one row, no batch axis); got {target.shape}."
        )
    gamma, vocab = target.shape[0] - 1, target.shape[1]
    draft = None if draft_probs is None else np.asarray(draft_probs, np.float64)
    if draft is not None and draft.shape != (gamma, vocab):
        raise ValueError(
            f"`draft_probs` must have shape (G, V) = {(gamma, vocab)}; got {draft.shape}."
        )
    if draft_law is None:
        if draft is None:
            raise ValueError(
                "With `draft_probs=None` (one-hot drafts), pass `draft_law`: the (G, V) "
                "law of the draft tokens (one-hot rows for a deterministic drafter)."
            )
        draft_law = draft
    law = np.asarray(draft_law, np.float64)
    if law.shape != (gamma, vocab):
        raise ValueError(
            f"`draft_law` must have shape (G, V) = {(gamma, vocab)}; got {law.shape}."
        )
    return draft, target, law / law.sum(-1, keepdims=True)


def _cells(breakpoints, subdivisions):
    """Midpoints and widths of the cells between sorted breakpoints in [0, 1], each cell
    split into `subdivisions` equal parts."""
    edges = np.unique(np.clip(np.concatenate([[0.0, 1.0], breakpoints]), 0, 1))
    fractions = (np.arange(subdivisions) + 0.5) / subdivisions
    lows, widths = edges[:-1], np.diff(edges)
    keep = widths > 0
    lows, widths = lows[keep], widths[keep]
    mids = (lows[:, None] + widths[:, None] * fractions).ravel()
    return mids, np.repeat(widths / subdivisions, subdivisions)


def _residual_cdfs(target, draft_rows):
    """Cumulative sums of every distribution the standard sampler may draw from."""
    cdfs = []
    for n, q in enumerate(draft_rows):
        residual = np.maximum(target[n] - q, 0)
        if residual.sum() <= 0:
            residual = target[n]
        cdfs.append(np.cumsum(residual) / residual.sum())
    cdfs.append(np.cumsum(target[-1]) / target[-1].sum())
    return np.concatenate(cdfs)


def emission_by_quadrature(
    verifier: Verifier,
    draft_probs,
    target_probs,
    *,
    draft_law=None,
    log_inputs: bool = False,
    accept_breakpoints=None,
    sample_breakpoints=None,
    subdivisions: int = 2,
    chunk_size: int = 1 << 16,
) -> EmissionEstimate:
    """Computes, by deterministic quadrature over the uniforms, how often `verifier`
    emits each token at each position, for one row with fixed distributions.

    The verifier is a deterministic function of the draft tokens $x$ and the uniforms
    $(u_0, \\dots, u_{G-1}, s)$. This evaluates it on every draft sequence (weighted by its
    probability under `draft_law`) and on a stratified grid of uniforms (weighted by cell
    volume). The grid's cells in $u_i$ are bounded by the ratios $p_i(v) / q_i(v)$, and in
    $s$ by the cumulative sums of every residual the standard rule may draw from, each
    split into `subdivisions` parts: for the standard verifier the result is exact up to
    float rounding; for other rules the error shrinks as `subdivisions` grows.

    Cost: $V^G \\cdot (\\#u\\text{ cells})^G \\cdot \\#s\\text{ cells}$ verifier rows, so for
    small cases ($V \\le 8$, $G \\le 3$).

    **Arguments:**

    - `verifier`: the [`eqx_specdec.Verifier`][] to measure.
    - `draft_probs`: `(G, V)`, the draft distributions $q_i$ given to the verifier, or
        `None` for one-hot drafts.
    - `target_probs`: `(G + 1, V)`, the target distributions $p_i$.
    - `draft_law`: `(G, V)`, the law the draft tokens are drawn from. Defaults to
        `draft_probs`; required when `draft_probs` is `None`.
    - `log_inputs`: pass $\\log q$ and $\\log p$ to the verifier, for verifiers whose
        stages read log-probabilities (`log_space=True`).
    - `accept_breakpoints`: `(G, K)`, further values of $u_i$ where the verifier's
        outcome may change (for a lenient test with lenience $l$, the ratios
        $p_i(v) / (l\\, q_i(v))$). Cells are cut there too, which keeps the quadrature
        exact for rules whose thresholds are not the standard ones.
    - `sample_breakpoints`: `(K,)`, further values of $s$ where the sampled token may
        change (the cumulative sums of a non-standard correction distribution).
    - `subdivisions`: grid points per cell and axis.
    - `chunk_size`: verifier rows per compiled call.

    **Returns:**

    An [`eqx_specdec.EmissionEstimate`][] of probabilities.
    """
    draft, target, law = _checked(draft_probs, target_probs, draft_law)
    gamma, vocab = law.shape
    sequences = [
        (x, np.prod(law[np.arange(gamma), x]))
        for x in itertools.product(range(vocab), repeat=gamma)
    ]
    sequences = [(np.array(x), w) for x, w in sequences if w > 0]
    u_cells = []
    for i in range(gamma):
        if draft is None:
            ratios = target[i]
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios = np.where(draft[i] > 0, target[i] / draft[i], 1.0)
        if accept_breakpoints is not None:
            extra = np.asarray(accept_breakpoints, np.float64)[i]
            ratios = np.concatenate([ratios, extra[np.isfinite(extra)]])
        u_cells.append(_cells(ratios, subdivisions))
    if draft is None:
        s_breaks = np.concatenate(
            [_residual_cdfs(target, np.eye(vocab)[list(x)]) for x, _ in sequences]
        )
    else:
        s_breaks = _residual_cdfs(target, draft)
    if sample_breakpoints is not None:
        s_breaks = np.concatenate([s_breaks, np.ravel(sample_breakpoints)])
    s_mids, s_widths = _cells(s_breaks, subdivisions)
    grids = [c[0] for c in u_cells] + [s_mids]
    grid_weights = [c[1] for c in u_cells] + [s_widths]
    index = np.stack(
        np.meshgrid(*[np.arange(len(g)) for g in grids], indexing="ij"), -1
    ).reshape(-1, gamma + 1)
    uniforms = np.stack([grids[d][index[:, d]] for d in range(gamma + 1)], -1)
    volume = np.prod([grid_weights[d][index[:, d]] for d in range(gamma + 1)], axis=0)

    run = jax.jit(jax.vmap(verifier.row, in_axes=(0, None, None, 0, 0)))
    q, p = _verifier_inputs(draft, target, log_inputs)
    emitted = np.zeros((gamma + 1, vocab))
    reached = np.zeros(gamma + 1)
    u = uniforms[:, :gamma].astype(np.float32)
    s = uniforms[:, gamma].astype(np.float32)
    for x, weight in sequences:
        for start in range(0, len(volume), chunk_size):
            stop = min(start + chunk_size, len(volume))
            rows = stop - start
            xs = jnp.asarray(np.broadcast_to(x, (rows, gamma)), jnp.int32)
            tokens = np.asarray(
                run(xs, q, p, jnp.asarray(u[start:stop]), jnp.asarray(s[start:stop]))[
                    "tokens"
                ]
            )
            w = weight * volume[start:stop]
            _accumulate(emitted, reached, tokens, w, vocab)
    return EmissionEstimate(emitted, reached)


def _verifier_inputs(draft, target, log_inputs):
    """The distributions as the verifier reads them: float32 probabilities, or their
    logarithms (computed in float64, so exact zeros become -inf)."""

    def convert(a):
        if a is None:
            return None
        if log_inputs:
            with np.errstate(divide="ignore"):
                a = np.log(a)
        return jnp.asarray(a, jnp.float32)

    return convert(draft), convert(target)


def _accumulate(emitted, reached, tokens, weights, vocab):
    for k in range(tokens.shape[1]):
        valid = tokens[:, k] >= 0
        emitted[k] += np.bincount(tokens[valid, k], weights[valid], minlength=vocab)[
            :vocab
        ]
        reached[k] += weights[valid].sum()


def emission_by_monte_carlo(
    verifier: Verifier,
    draft_probs,
    target_probs,
    key,
    num_draws: int,
    *,
    draft_law=None,
    log_inputs: bool = False,
    chunk_size: int = 16_384,
) -> EmissionEstimate:
    """Counts, over `num_draws` random steps, how often `verifier` emits each token at
    each position, for one row with fixed distributions.

    Each draw samples the draft tokens $x_i$ from `draft_law` (inverse CDF) and the
    float32 uniforms $u_i$, $s$ with `jax.random.uniform` (for a key-driven sampler, one
    key per draw instead of $s$), all from `key`: the same key gives the same counts. Pair with [`eqx_specdec.EmissionEstimate.chi_square`][].

    **Arguments:**

    - `verifier`: the [`eqx_specdec.Verifier`][] to measure.
    - `draft_probs`: `(G, V)`, or `None` for one-hot drafts.
    - `target_probs`: `(G + 1, V)`.
    - `key`: a `jax.random` key.
    - `num_draws`: the number of verification steps to simulate.
    - `draft_law`: `(G, V)`, the law of the draft tokens; defaults to `draft_probs`.
    - `log_inputs`: pass $\\log q$ and $\\log p$ to the verifier.
    - `chunk_size`: draws per compiled call.

    **Returns:**

    An [`eqx_specdec.EmissionEstimate`][] of counts.
    """
    draft, target, law = _checked(draft_probs, target_probs, draft_law)
    gamma, vocab = law.shape
    q, p = _verifier_inputs(draft, target, log_inputs)
    law_cdf = jnp.asarray(np.cumsum(law, -1), jnp.float32)
    row = jax.vmap(verifier.row, in_axes=(0, None, None, 0, 0))

    @jax.jit
    def step(key):
        k_x, k_u, k_s = jax.random.split(key, 3)
        draws = jax.random.uniform(k_x, (chunk_size, gamma), jnp.float32)
        xs = jnp.stack(
            [
                jnp.searchsorted(law_cdf[i], draws[:, i], side="right")
                for i in range(gamma)
            ],
            axis=1,
        )
        xs = jnp.minimum(xs, vocab - 1).astype(jnp.int32)
        u = jax.random.uniform(k_u, (chunk_size, gamma), jnp.float32)
        if verifier.residual_sampler.randomness == "key":
            s = jax.random.split(k_s, chunk_size)
        else:
            s = jax.random.uniform(k_s, (chunk_size,), jnp.float32)
        return row(xs, q, p, u, s)["tokens"]

    emitted = np.zeros((gamma + 1, vocab))
    reached = np.zeros(gamma + 1)
    chunks = -(-num_draws // chunk_size)
    for i, chunk_key in enumerate(jax.random.split(key, chunks)):
        tokens = np.asarray(step(chunk_key))
        rows = min(chunk_size, num_draws - i * chunk_size)
        _accumulate(emitted, reached, tokens[:rows], np.ones(rows), vocab)
    return EmissionEstimate(emitted, reached, num_draws)
