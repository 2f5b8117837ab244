"""Tools that measure the distribution a verifier emits, to show it is lossless."""

import abc
import functools
import itertools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._capabilities import has_capability, require
from .._chain.abstract_verifier import AbstractVerifier
from .._chain.verifier import Verifier
from .._errors import MissingCapabilityError
from .._stages.row_context import RowContext
from .._tree.abstract_tree_verifier import AbstractTreeVerifier, tree_of
from .emission import accumulate, cells, EmissionEstimate, padded_size
from .tree_evaluation import (
    tree_emission_by_monte_carlo,
    tree_emission_by_quadrature,
    tree_quadrature_problem,
)
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


def _refuse_for_trees(tool: str, verifier, **given) -> None:
    """A `ValueError` naming the arguments given that a tree's evaluation does not use:
    a tree's children are drawn by its node rule's `candidate_law` (not `draft_law`),
    its rule reads probabilities (not `log_inputs`), and its quadrature cuts the
    uniforms where the rule's `pass_threshold` says, exactly (no breakpoints or
    subdivisions to give)."""
    ignored = [name for name, value in given.items() if value is not None]
    if ignored:
        names = ", ".join(f"`{name}`" for name in ignored)
        raise ValueError(
            f"{tool}: {type(verifier).__name__} is a tree verifier, whose evaluation "
            f"does not use {names}: its children are drawn by its node rule's "
            "`candidate_law`, it reads probabilities, and its cells are cut exactly "
            "where the rule's `pass_threshold` says. Leave them out."
        )


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


def _chain_quadrature(
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


def _chain_monte_carlo(
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


def _root_optimum(verifier, q, p, root_acceptance) -> dict:
    """The measured acceptance at the root beside the optimum of the drafting rule's
    draft law, where the rule can say it (and the root has children)."""
    rule = verifier.drafting_rule()
    children = sum(1 for parent in verifier.tree if parent == -1)
    if not children:
        return {}
    if not has_capability(rule, "optimal_acceptance"):
        return {"root_acceptance": root_acceptance}
    draft = np.zeros_like(p[0]) if q is None else q[0]
    optimum = rule.optimal_acceptance(
        jnp.asarray(p[0], jnp.float32), jnp.asarray(draft, jnp.float32), children
    )
    return {"root_acceptance": root_acceptance, "optimal_acceptance": float(optimum)}


class AbstractEvaluationFamily(eqx.Module):
    """What the evaluation tools do that depends on the verifier's family: how its
    emission is measured, when exact quadrature applies, what its tokens are measured
    against, what else is reported. [`eqx_specdec.families.evaluation_family`][]
    returns one per verifier; a family of your own subclasses this and registers it.

    All of it runs on the host (NumPy in, NumPy out), outside any trace.

    **Fields:**

    - `verifier`: the verifier evaluated.
    """

    verifier: eqx.AbstractVar[object]

    @abc.abstractmethod
    def quadrature(self, draft_probs, target_probs, **options) -> EmissionEstimate:
        """The emission measured by exact quadrature, as
        [`eqx_specdec.evaluation.emission_by_quadrature`][] returns it; `options` are
        that tool's keyword arguments."""

    @abc.abstractmethod
    def monte_carlo(
        self, draft_probs, target_probs, key, num_draws: int, **options
    ) -> EmissionEstimate:
        """The emission counted over `num_draws` draws, as
        [`eqx_specdec.evaluation.emission_by_monte_carlo`][] returns it."""

    @abc.abstractmethod
    def check_shape(self, tool: str) -> None:
        """Raises, naming `tool`, when the verifier cannot be evaluated at all (before
        any work); returns `None` otherwise."""

    @abc.abstractmethod
    def quadrature_problem(self, q, p) -> Exception | None:
        """Why exact quadrature does not apply to these distributions (the error to
        raise when it is asked for), or `None` when it does."""

    @abc.abstractmethod
    def target(self, p, accepted_law) -> tuple[np.ndarray, int]:
        """What the emitted tokens are measured against, one row per position, and the
        number of draft positions (given the measured law of the number accepted)."""

    @abc.abstractmethod
    def extra_fields(self, q, p, root_acceptance: float) -> dict:
        """Fields of [`eqx_specdec.evaluation.Evaluation`][] that only this family
        reports (`{}` for none)."""


class _ChainEvaluation(AbstractEvaluationFamily):
    verifier: AbstractVerifier

    def quadrature(self, draft_probs, target_probs, **options):
        return _chain_quadrature(self.verifier, draft_probs, target_probs, **options)

    def monte_carlo(self, draft_probs, target_probs, key, num_draws, **options):
        return _chain_monte_carlo(
            self.verifier, draft_probs, target_probs, key, num_draws, **options
        )

    def check_shape(self, tool: str) -> None:
        """Nothing to check: a chain's shape comes with its distributions."""

    def quadrature_problem(self, q, p) -> Exception | None:
        vocab, gamma = p.shape[1], p.shape[0] - 1
        if vocab**gamma > 256:
            return ValueError(
                f'`method="quadrature"` does not apply here: V^G = {vocab}^{gamma} > '
                "256."
            )
        try:
            stage_breakpoints(self.verifier, q, p)
        except MissingCapabilityError as error:
            return error
        return None

    def target(self, p, accepted_law) -> tuple[np.ndarray, int]:
        return emission_target(self.verifier.ratio_test, p), p.shape[0] - 1

    def extra_fields(self, q, p, root_acceptance: float) -> dict:
        return {}


def emission_target(ratio_test, p: np.ndarray) -> np.ndarray:
    """What a chain verifier's tokens are measured against: the law an exact rule
    declares through its sampler (greedy decoding of $p$, the one-hot of its argmax,
    when that sampler `draws` `"argmax"`), else $p$ (every sampling rule, and every
    lossy rule, whose distance from the target is what one measures)."""
    if ratio_test.exact and ratio_test.sampler.draws == "argmax":
        return np.eye(p.shape[-1])[np.argmax(p, -1)]
    return p


class _TreeEvaluation(AbstractEvaluationFamily):
    verifier: AbstractTreeVerifier

    def quadrature(self, draft_probs, target_probs, *, chunk_size, **given):
        _refuse_for_trees("emission_by_quadrature", self.verifier, **given)
        return tree_emission_by_quadrature(
            self.verifier, draft_probs, target_probs, chunk_size=chunk_size
        )

    def monte_carlo(
        self, draft_probs, target_probs, key, num_draws, *, chunk_size, **given
    ):
        _refuse_for_trees("emission_by_monte_carlo", self.verifier, **given)
        return tree_emission_by_monte_carlo(
            self.verifier, draft_probs, target_probs, key, num_draws, chunk_size
        )

    def check_shape(self, tool: str) -> None:
        tree_of(self.verifier, tool)  # a clear error before any work

    def quadrature_problem(self, q, p) -> Exception | None:
        return tree_quadrature_problem(self.verifier, p.shape[1])

    def target(self, p, accepted_law) -> tuple[np.ndarray, int]:
        return p, len(accepted_law) - 1

    def extra_fields(self, q, p, root_acceptance: float) -> dict:
        return _root_optimum(self.verifier, q, p, root_acceptance)


@functools.singledispatch
def evaluation_family(verifier) -> AbstractEvaluationFamily:
    """The [`eqx_specdec.families.AbstractEvaluationFamily`][] of `verifier`, which
    the evaluation tools ([`eqx_specdec.evaluation.evaluate_verifier`][], the emission
    estimators) call. Chains and trees register theirs; a family of your own registers
    with `@evaluation_family.register` on a function of its verifier class.

    **Arguments:**

    - `verifier`: the verifier.

    **Returns:**

    Its [`eqx_specdec.families.AbstractEvaluationFamily`][].
    """
    raise TypeError(
        "`verifier` must be an eqx_specdec.Verifier (or ShardedVerifier), or a tree "
        f"verifier (TreeVerifier, TraversalVerifier); got {type(verifier).__name__}."
    )


@evaluation_family.register
def _chains(verifier: AbstractVerifier) -> AbstractEvaluationFamily:
    return _ChainEvaluation(verifier)


@evaluation_family.register
def _trees(verifier: AbstractTreeVerifier) -> AbstractEvaluationFamily:
    return _TreeEvaluation(verifier)
