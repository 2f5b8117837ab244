"""What the losslessness tools measure: how often a verifier emits each token at each
position, and the quadrature grid they measure it on."""

import equinox as eqx
import numpy as np


class EmissionEstimate(eqx.Module):
    """How often a verifier emits each token at each output position.

    Position $k$ of the output (`tokens[k]`) is *reached* when $n \\ge k$ (it holds a token,
    not `-1`). A lossless verifier emits, at every reached position $k$, a token
    distributed as $p_k$: `conditional()[k]` must equal `target_probs[k]`.

    For a tree ([`eqx_specdec.TreeVerifier`][]) the positions are the tree's contexts:
    row 0 is the root, row $i + 1$ the context after node $i$; a context is reached when
    the accepted path reaches it, and the token emitted after it must follow
    `target_probs[i + 1]`.

    Produced by [`eqx_specdec.evaluation.emission_by_quadrature`][] (probabilities, `num_draws` is
    `None`) and [`eqx_specdec.evaluation.emission_by_monte_carlo`][] (counts out of `num_draws`).

    **Arguments:**

    - `emitted`: float64 `(G + 1, V)`, the probability (quadrature) or count (Monte Carlo)
        of `tokens[k] == v`.
    - `reached`: float64 `(G + 1,)`, the probability or count of `tokens[k] != -1`,
        that is of $n \\ge k$.
    - `num_draws`: the number of Monte Carlo draws, or `None` for quadrature.
    - `accepted`: for trees, float64 `(depth + 1,)`, the probability or count of each
        accepted path length; `None` for chains (it follows from `reached`).
    """

    emitted: np.ndarray
    reached: np.ndarray
    num_draws: int | None = eqx.field(static=True, default=None)
    accepted: np.ndarray | None = None

    def accepted_distribution(self) -> np.ndarray:
        """The distribution of the number accepted $n$, float64 `(max n + 1,)`. For a
        chain, $P(n = k) = P(n \\ge k) - P(n \\ge k + 1)$ from `reached`; for a tree,
        the `accepted` field (positions there are nodes, not depths)."""
        if self.accepted is not None:
            counts = np.asarray(self.accepted, np.float64)
        else:
            counts = self.reached - np.append(self.reached[1:], 0.0)
        return counts / counts.sum()

    def conditional(self) -> np.ndarray:
        """The distribution of `tokens[k]` given that position $k$ is reached:
        `emitted / reached`, float64 `(G + 1, V)`; rows never reached are NaN."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.emitted / self.reached[:, None]

    def distance_noise(self, target_probs) -> np.ndarray:
        """Per position, the total variation distance that sampling noise alone gives a
        lossless verifier's Monte Carlo counts on average,
        $\\tfrac12 \\sum_v \\sqrt{2\\, p_k(v) (1 - p_k(v)) / (\\pi\\, m_k)}$ for $m_k$
        draws reaching position $k$ (the normal approximation of
        $E|\\hat p - p|$): a measured distance near it is noise, not a loss. Zeros for
        quadrature; NaN at positions never reached.

        **Arguments:**

        - `target_probs`: `(G + 1, V)`, the target distributions $p_k$.

        **Returns:**

        Float64 `(G + 1,)`.
        """
        target = np.asarray(target_probs, np.float64)
        if self.num_draws is None:
            return np.where(self.reached > 0, 0.0, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            spread = np.sqrt(
                2 * target * (1 - target) / (np.pi * self.reached[:, None])
            )
            return np.where(self.reached > 0, 0.5 * spread.sum(-1), np.nan)

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


def cells(breakpoints, subdivisions):
    """Midpoints and widths of the cells between sorted breakpoints in [0, 1], each cell
    split into `subdivisions` equal parts."""
    edges = np.unique(np.clip(np.concatenate([[0.0, 1.0], breakpoints]), 0, 1))
    fractions = (np.arange(subdivisions) + 0.5) / subdivisions
    lows, widths = edges[:-1], np.diff(edges)
    keep = widths > 0
    lows, widths = lows[keep], widths[keep]
    mids = (lows[:, None] + widths[:, None] * fractions).ravel()
    return mids, np.repeat(widths / subdivisions, subdivisions)


def accumulate(emitted, reached, tokens, weights, vocab):
    for k in range(tokens.shape[1]):
        valid = tokens[:, k] >= 0
        emitted[k] += np.bincount(tokens[valid, k], weights[valid], minlength=vocab)[
            :vocab
        ]
        reached[k] += weights[valid].sum()


def padded_size(rows: int, chunk_size: int) -> int:
    """Rows per compiled call: `chunk_size`, or the next power of two (at least 1024)
    for fewer rows, so that cases of similar size share a compiled program."""
    return min(chunk_size, max(1024, 1 << max(rows - 1, 0).bit_length()))
