"""A chain verifier's emission, measured: by exact quadrature over the uniforms' cells,
and by Monte Carlo."""

import itertools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._capabilities import has_capability, require
from .._chain.verifier import Verifier
from .._stages.row_context import RowContext
from .emission import accumulate, cells, EmissionEstimate, padded_size
from .validation import check_distributions


# The narrowest cell (in every axis) whose points are compared; float32 spacing near 1
# is 6e-8.
_COMPARED_WIDTH = 1e-5


def checked_row(draft_probs, target_probs, draft_law):
    """One row's distributions for the evaluation tools, checked: `(draft, target,
    law)` as float64 NumPy (`draft` `None` for one-hot drafts), the law normalised."""
    check_distributions(
        "the emission tools",
        draft_probs=draft_probs,
        target_probs=target_probs,
        draft_law=draft_law,
    )
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


# Beyond this many verifier rows, quadrature is refused (minutes of work, gigabytes).
MAX_QUADRATURE_ROWS = 50_000_000


def _check_cost(rows: int, gamma: int, vocab: int):
    """Refuses, before any work, a quadrature of more than `MAX_QUADRATURE_ROWS` rows."""
    if rows > MAX_QUADRATURE_ROWS:
        raise ValueError(
            f"emission_by_quadrature would evaluate the verifier on {rows:,} rows or more "
            f"(V = {vocab}, G = {gamma}: every draft sequence times the grid of "
            f"uniforms), more than {MAX_QUADRATURE_ROWS:,}. Use emission_by_monte_carlo, "
            "or a smaller V or G."
        )


def stage_breakpoints(
    verifier: Verifier, draft_probs, target_probs, given: bool = False
) -> dict:
    """The breakpoints the verifier's ratio test and sampler declare (their
    `quadrature_breakpoints` capability), merged. A stage without the capability is an
    error, unless the caller `given` breakpoints of their own (which then stand for
    that stage's; the other stage's are still merged)."""
    found = {"accept_breakpoints": [], "sample_breakpoints": []}
    for stage in (verifier.ratio_test, verifier.residual_sampler):
        if given and not has_capability(stage, "quadrature_breakpoints"):
            continue
        require(
            stage,
            "quadrature_breakpoints",
            "exact quadrature",
            'use method="monte-carlo", or pass the breakpoints to '
            "emission_by_quadrature yourself",
        )
        for name, value in stage.quadrature_breakpoints(
            draft_probs, target_probs
        ).items():
            found[name].append(np.asarray(value, np.float64))
    accept = found["accept_breakpoints"]
    sample = found["sample_breakpoints"]
    return dict(
        accept_breakpoints=np.concatenate(accept, axis=1) if accept else None,
        sample_breakpoints=np.concatenate([b.ravel() for b in sample])
        if sample
        else None,
    )


def chain_quadrature(
    verifier,
    draft_probs,
    target_probs,
    *,
    draft_law,
    log_inputs,
    accept_breakpoints,
    sample_breakpoints,
    subdivisions,
    chunk_size,
) -> EmissionEstimate:
    """`emission_by_quadrature` for a chain verifier."""
    if subdivisions is None:
        subdivisions = 2
    draft, target, law = checked_row(draft_probs, target_probs, draft_law)
    gamma, vocab = law.shape
    _check_cost(math.prod(int(np.count_nonzero(row > 0)) for row in law), gamma, vocab)
    declared = stage_breakpoints(
        verifier,
        None if draft_probs is None else np.asarray(draft_probs, np.float64),
        np.asarray(target_probs, np.float64),
        given=accept_breakpoints is not None or sample_breakpoints is not None,
    )
    accept_breakpoints = _merge(accept_breakpoints, declared["accept_breakpoints"], 1)
    sample_breakpoints = _merge(sample_breakpoints, declared["sample_breakpoints"], 0)
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
        u_cells.append(cells(ratios, subdivisions))
    if draft is None:
        s_breaks = np.concatenate(
            [_residual_cdfs(target, np.eye(vocab)[list(x)]) for x, _ in sequences]
        )
    else:
        s_breaks = _residual_cdfs(target, draft)
    if sample_breakpoints is not None:
        s_breaks = np.concatenate([s_breaks, np.ravel(sample_breakpoints)])
    s_mids, s_widths = cells(s_breaks, subdivisions)
    _check_cost(
        len(sequences) * len(s_mids) * math.prod(len(c[0]) for c in u_cells),
        gamma,
        vocab,
    )
    grids = [c[0] for c in u_cells] + [s_mids]
    grid_weights = [c[1] for c in u_cells] + [s_widths]
    index = np.stack(
        np.meshgrid(*[np.arange(len(g)) for g in grids], indexing="ij"), -1
    ).reshape(-1, gamma + 1)
    uniforms = np.stack([grids[d][index[:, d]] for d in range(gamma + 1)], -1)
    volume = np.prod([grid_weights[d][index[:, d]] for d in range(gamma + 1)], axis=0)

    # The rows sharing a cell in every axis (its `subdivisions` points per axis): the
    # verifier's tokens must be equal across them, or a breakpoint is missing.
    _, cell_of = np.unique(index // subdivisions, axis=0, return_inverse=True)
    cell_of = cell_of.ravel()
    first = np.zeros(cell_of.max() + 1, np.int64)
    first[cell_of[::-1]] = np.arange(len(cell_of))[::-1]
    # Cells narrower than this in some axis are not compared: float32 uniforms cannot
    # place two points on one side of a cut so close to it.
    widths = np.stack([grid_weights[d][index[:, d]] for d in range(gamma + 1)], -1)
    wide = np.all(widths * subdivisions > _COMPARED_WIDTH, axis=-1)
    q, p = _verifier_inputs(draft, target, log_inputs)
    emitted = np.zeros((gamma + 1, vocab))
    reached = np.zeros(gamma + 1)
    u = uniforms[:, :gamma].astype(np.float32)
    s = uniforms[:, gamma].astype(np.float32)
    size = padded_size(len(volume), chunk_size)
    found = []
    for x, weight in sequences:
        for start in range(0, len(volume), size):
            stop = min(start + size, len(volume))
            pad = ((0, size - (stop - start)),)
            xs = jnp.asarray(np.broadcast_to(x, (size, gamma)), jnp.int32)
            u_chunk = jnp.asarray(
                np.pad(u[start:stop], pad + ((0, 0),), constant_values=0.5)
            )
            s_chunk = jnp.asarray(np.pad(s[start:stop], pad, constant_values=0.5))
            tokens = np.asarray(
                verify_rows(verifier, xs, q, p, u_chunk, s_chunk, bool(log_inputs))
            )
            w = weight * volume[start:stop]
            accumulate(emitted, reached, tokens[: stop - start], w, vocab)
            found.append(tokens[: stop - start])
        _check_cells(verifier, np.concatenate(found), cell_of, first, uniforms, x, wide)
        found.clear()
    return EmissionEstimate(emitted, reached)


def _check_cells(verifier, tokens, cell_of, first, uniforms, draft_tokens, wide):
    """Raises unless the verifier's tokens are constant on every cell of the grid, as
    exact quadrature assumes (cells wider than `_COMPARED_WIDTH` in every axis): a
    stage whose `quadrature_breakpoints` miss a cut gives
    different tokens at two points of one cell (when the cut lies between them)."""
    differs = np.any(tokens != tokens[first[cell_of]], axis=1) & wide
    if not np.any(differs):
        return
    row = int(np.argmax(differs))
    stages = ", ".join(
        type(stage).__name__
        for stage in (verifier.ratio_test, verifier.residual_sampler)
    )
    raise ValueError(
        "emission_by_quadrature: the verifier's tokens change inside one quadrature cell "
        f"(draft tokens {draft_tokens.tolist()}, uniforms "
        f"{np.round(uniforms[row], 6).tolist()} against "
        f"{np.round(uniforms[first[cell_of[row]]], 6).tolist()}), so the result would "
        f"not be exact. A stage of ({stages}) changes its outcome at a value its "
        "`quadrature_breakpoints` does not return: return every value of $u_i$ (and "
        'of $s$) where its outcome can change, or use method="monte-carlo".'
    )


def _merge(given, declared, axis):
    if given is None or declared is None:
        return declared if given is None else given
    given = np.asarray(given, np.float64)
    if axis == 0:
        return np.concatenate([given.ravel(), declared])
    return np.concatenate([given, declared], axis=1)


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


def chain_monte_carlo(
    verifier,
    draft_probs,
    target_probs,
    key,
    num_draws,
    *,
    draft_law,
    log_inputs,
    chunk_size,
) -> EmissionEstimate:
    """`emission_by_monte_carlo` for a chain verifier."""
    draft, target, law = checked_row(draft_probs, target_probs, draft_law)
    gamma, vocab = law.shape
    q, p = _verifier_inputs(draft, target, log_inputs)
    law_cdf = jnp.asarray(np.cumsum(law, -1), jnp.float32)
    emitted = np.zeros((gamma + 1, vocab))
    reached = np.zeros(gamma + 1)
    chunks = -(-num_draws // chunk_size)
    for i, chunk_key in enumerate(jax.random.split(key, chunks)):
        tokens = np.asarray(
            _monte_carlo_chunk(
                verifier, q, p, law_cdf, chunk_key, chunk_size, bool(log_inputs)
            )
        )
        rows = min(chunk_size, num_draws - i * chunk_size)
        accumulate(emitted, reached, tokens[:rows], np.ones(rows), vocab)
    return EmissionEstimate(emitted, reached, num_draws)


@eqx.filter_jit
def _monte_carlo_chunk(verifier, q, p, law_cdf, key, chunk_size: int, log_space):
    """The tokens of `chunk_size` random steps. Compiled once per verifier configuration
    and shapes (the distributions are arguments, not constants), so that measurements of
    many cases share one program."""
    gamma, vocab = law_cdf.shape
    k_x, k_u, k_s = jax.random.split(key, 3)
    draws = jax.random.uniform(k_x, (chunk_size, gamma), jnp.float32)
    xs = jnp.stack(
        [jnp.searchsorted(law_cdf[i], draws[:, i], side="right") for i in range(gamma)],
        axis=1,
    )
    xs = jnp.minimum(xs, vocab - 1).astype(jnp.int32)
    u = jax.random.uniform(k_u, (chunk_size, gamma), jnp.float32)
    if verifier.residual_sampler.randomness == "key":
        s = jax.random.split(k_s, chunk_size)
    else:
        s = jax.random.uniform(k_s, (chunk_size,), jnp.float32)
    rows = jax.vmap(verifier.row, in_axes=(0, None, None, 0, 0, None))
    return rows(xs, q, p, u, s, RowContext(log_space=log_space))["tokens"]


@eqx.filter_jit
def verify_rows(
    verifier, draft_tokens, draft_probs, target_probs, accept, sample, log_space=False
):
    """`verifier.row` over rows of draft tokens and uniforms, for one fixed row of
    distributions (probabilities, or log-probabilities with `log_space`). Compiled once
    per verifier configuration and shapes."""
    rows = jax.vmap(verifier.row, in_axes=(0, None, None, 0, 0, None))
    context = RowContext(log_space=log_space)
    return rows(draft_tokens, draft_probs, target_probs, accept, sample, context)[
        "tokens"
    ]
