"""Measuring a verifier on fixed distributions: distance from its target, acceptance
rate and tokens per step, by exact quadrature where it applies and Monte Carlo
otherwise. Behind the `evaluate` command."""

import dataclasses
from typing import Literal

import equinox as eqx
import jax
import numpy as np

from .._misc import numpy_softmax
from .closed_form import closed_form_problem, emission_in_closed_form
from .families import evaluation_family
from .lossless import emission_by_monte_carlo, emission_by_quadrature
from .validation import check_distributions


SYNTHETIC_KINDS = (
    "flat",
    "peaked",
    "near-equal",
    "disjoint",
    "equal",
    "sparse",
    "one-hot",
    "one-hot implicit",
)


def _f32(a):
    # The verifier sees float32; the expected distributions are those float32 values.
    return np.asarray(a, np.float32).astype(np.float64)


def synthetic_distributions(kind: str, gamma: int, vocab: int, seed: int):
    """Draft and target distributions for one row, from a family of synthetic cases.

    **Arguments:**

    - `kind`: `"flat"` (temperature-10 softmaxes of normal logits), `"peaked"`
        (temperature 1/4, draft correlated with the target), `"near-equal"` (draft a small
        perturbation of the target), `"disjoint"` (draft and target supports on different
        halves of the vocabulary at the drafted positions), `"equal"`, `"sparse"` (zeros
        in both), `"one-hot"` (a dense one-hot argmax drafter) or `"one-hot implicit"`
        (one-hot drafts, `draft_probs=None`, from a law close to the target).
    - `gamma`: $G$.
    - `vocab`: $V$.
    - `seed`: the NumPy seed.

    **Returns:**

    `(draft_probs, target_probs, draft_law)`: float64 NumPy arrays of shapes `(G, V)` (or
    `None`), `(G + 1, V)` and `(G, V)` (the law the draft tokens are drawn from), holding
    float32-representable values.
    """
    if kind not in SYNTHETIC_KINDS:
        raise ValueError(f"`kind` must be one of {SYNTHETIC_KINDS}, got {kind!r}.")
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(gamma + 1, vocab))
    if kind == "flat":
        p = numpy_softmax(0.1 * logits)
        q = numpy_softmax(0.1 * rng.normal(size=(gamma, vocab)))
    elif kind == "peaked":
        p = numpy_softmax(4.0 * logits)
        q = numpy_softmax(
            4.0 * (0.7 * logits[:gamma] + 0.7 * rng.normal(size=(gamma, vocab)))
        )
    elif kind == "near-equal":
        p = numpy_softmax(logits)
        q = numpy_softmax(logits[:gamma] + 0.05 * rng.normal(size=(gamma, vocab)))
    elif kind == "disjoint":
        half = vocab // 2
        p = numpy_softmax(logits)
        p[:gamma, half:] = 0
        q = numpy_softmax(rng.normal(size=(gamma, vocab)))
        q[:, :half] = 0
    elif kind == "equal":
        p = numpy_softmax(logits)
        q = p[:gamma].copy()
    elif kind == "sparse":  # zeros in both, overlapping supports
        p = numpy_softmax(logits) * (rng.random((gamma + 1, vocab)) < 0.6)
        q = numpy_softmax(rng.normal(size=(gamma, vocab))) * (
            rng.random((gamma, vocab)) < 0.6
        )
        p[:, 0] += 1e-3
        q[:, 0] += 1e-3
    else:
        # A target with a few likely tokens, so that one-hot drafts are often accepted.
        p = 0.5 * numpy_softmax(8.0 * logits) + 0.5 * numpy_softmax(logits)
        if kind == "one-hot implicit":  # drafter tokens drawn from a law close to p
            law = numpy_softmax(
                8.0 * (logits[:gamma] + 0.3 * rng.normal(size=(gamma, vocab)))
            )
            return None, _f32(p / p.sum(-1, keepdims=True)), law
        # A deterministic drafter proposing the most likely target token (argmax), with
        # q_i = onehot(c_i) given as a dense array.
        q = np.eye(vocab)[np.argmax(p[:gamma], axis=-1)]
    p = _f32(p / p.sum(-1, keepdims=True))
    q = _f32(q / q.sum(-1, keepdims=True))
    return q, p, q


def _floats(values) -> tuple:
    return tuple(None if v is None or np.isnan(v) else float(v) for v in values)


class ChiSquare(eqx.Module):
    """Pearson's chi-square test of Monte Carlo counts against the target, per position
    (`None` at positions never reached); see
    [`eqx_specdec.evaluation.EmissionEstimate.chi_square`][].

    **Fields:**

    - `statistic`, `df`, `threshold`: per position, the statistic, its degrees of
        freedom and the tail threshold $\\mathrm{df} + 10\\sqrt{2\\,\\mathrm{df}}$.
    - `passed`: every statistic of a reached position under its threshold.
    """

    statistic: tuple[float | None, ...]
    df: tuple[float | None, ...]
    threshold: tuple[float | None, ...]
    passed: bool


class Evaluation(eqx.Module):
    """What [`eqx_specdec.evaluation.evaluate_verifier`][] measures of one verifier on one row of
    fixed distributions. Every field is always present; `None` where it does not apply.
    `str(evaluation)` is the table `eqx-specdec evaluate` prints, and `as_dict()` its
    `--json` output.

    **Fields:**

    - `method`: `"quadrature"` (exact), `"closed-form"` (exact: a threshold rule's
        chain, [`eqx_specdec.evaluation.emission_in_closed_form`][]) or `"monte-carlo"`.
    - `declared_exact`: whether the verifier declares itself exact
        (`verifier.exact` before the measurement). [`eqx_specdec.evaluation.evaluate_verifier`][]
        raises when such a verifier measures lossy.
    - `gamma`: the draft positions (a chain's $G$, a tree's depth); `vocab`: $V$.
    - `distance`: the largest, over positions reached (and, with Monte Carlo,
        measured: not under-sampled), total variation distance between the emitted
        token's conditional distribution and the target's; `None` when no position was
        measured (every one under-sampled: draw more, or evaluate exactly).
    - `distance_per_position`: per position (per context for a tree, root first), or
        `None` where never reached.
    - `acceptance_rate`: accepted draft tokens over drafted, $E[n] / G$.
    - `tokens_per_step`: $1 + E[n]$.
    - `tokens_per_step_error`: with Monte Carlo, the standard error of
        `tokens_per_step`, $\\sqrt{\\mathrm{Var}(n) / \\text{draws}}$; `None` for
        quadrature (exact).
    - `reached`: $P(n \\ge k)$ for $k = 0, \\dots, G$.
    - `root_acceptance`: for a tree, the probability that some child of the root is
        accepted; `None` for a chain.
    - `optimal_acceptance`: for a tree whose drafting rule implements
        `optimal_acceptance`, $\\alpha^*$ of its draft law with that many children (see
        [`eqx_specdec.evaluation.optimal_acceptance`][]); `None` otherwise.
    - `distance_noise_per_position`: with Monte Carlo, per position the distance
        sampling noise alone gives a lossless verifier at that position's count (see
        [`eqx_specdec.evaluation.EmissionEstimate.distance_noise`][]); `None` for quadrature.
    - `under_sampled`: with Monte Carlo, per position whether it was reached too
        rarely to measure (fewer than 5 draws per token the target can emit there);
        such positions do not enter `distance`, and print as "not measured". `None`
        for the exact methods.
    - `draws`: Monte Carlo draws (`None` for quadrature).
    - `chi_square`: a [`eqx_specdec.evaluation.ChiSquare`][] with Monte Carlo, `None` for
        quadrature.
    """

    method: Literal["quadrature", "closed-form", "monte-carlo"]
    gamma: int
    vocab: int
    declared_exact: bool
    distance: float | None
    distance_per_position: tuple[float | None, ...]
    acceptance_rate: float
    tokens_per_step: float
    reached: tuple[float, ...]
    tokens_per_step_error: float | None = None
    root_acceptance: float | None = None
    optimal_acceptance: float | None = None
    distance_noise_per_position: tuple[float | None, ...] | None = None
    under_sampled: tuple[bool, ...] | None = None
    draws: int | None = None
    chi_square: ChiSquare | None = None

    def as_dict(self) -> dict:
        """The fields as plain Python values (the chi-square test as a dict too)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.chi_square is not None:
            chi = self.chi_square
            out["chi_square"] = {
                f.name: getattr(chi, f.name) for f in dataclasses.fields(chi)
            }
        for name in (
            "distance_per_position",
            "reached",
            "distance_noise_per_position",
            "under_sampled",
        ):
            if out[name] is not None:
                out[name] = list(out[name])
        return out

    def __str__(self) -> str:
        how = {
            "quadrature": "exact quadrature",
            "closed-form": "exact, in closed form",
        }.get(self.method, f"Monte Carlo, {self.draws} draws")
        under = self.under_sampled or (False,) * len(self.distance_per_position)
        per = " ".join(
            "-" if d is None else ("not measured" if u else f"{d:.4g}")
            for d, u in zip(self.distance_per_position, under)
        )
        distance = (
            "not measured (every position under-sampled)"
            if self.distance is None
            else f"{self.distance:.4g}"
        )
        claim = "declared exact" if self.declared_exact else "declared lossy"
        lines = [
            f"method: {how}",
            f"{claim}, measured distance from the target, max TV over positions: "
            f"{distance}",
            f"  per position: {per}",
        ]
        if self.chi_square is not None:
            chi = self.chi_square
            cells = [
                f"{s:.1f}/{t:.1f}"
                for s, t in zip(chi.statistic, chi.threshold)
                if s is not None
            ]
            verdict = "consistent with the target" if chi.passed else "REJECTED"
            noise = " ".join(
                "-" if d is None else f"{d:.2g}"
                for d in self.distance_noise_per_position
            )
            lines.append(f"  sampling noise per position: {noise}")
            lines.append(
                f"  chi-square / threshold per position: {' '.join(cells)} ({verdict})"
            )
        if self.root_acceptance is not None:
            lines.append(f"root acceptance: {self.root_acceptance:.4f}")
        if self.optimal_acceptance is not None:
            lines.append(f"optimal root acceptance: {self.optimal_acceptance:.4f}")
        lines.append(f"acceptance rate: {self.acceptance_rate:.4f}")
        error = self.tokens_per_step_error
        spread = "" if error is None else f" +/- {error:.4f} (standard error)"
        lines.append(f"expected tokens per step: {self.tokens_per_step:.4f}{spread}")
        return "\n".join(lines)


def _total_variation(a, b):
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


# Past this distance an exact method's measurement refutes a declaration of exactness
# (float32 verifiers measure exact rules within about 1e-6).
EXACT_TOLERANCE = 1e-4


def evaluate_verifier(
    verifier: eqx.Module,
    draft_probs,
    target_probs,
    *,
    draft_law=None,
    method: Literal["auto", "quadrature", "closed-form", "monte-carlo"] = "auto",
    num_draws: int = 200_000,
    key=None,
) -> Evaluation:
    """Measures one verifier on one row of fixed distributions: how far the tokens it
    emits are from its target, its acceptance rate and its tokens per step, and holds a
    verifier that declares itself exact to that claim.

    The tokens are measured against the law the rule declares: $p$, or greedy decoding
    of $p$ (the one-hot of its argmax) for an exact rule whose `sampler` draws
    `"argmax"` ([`eqx_specdec.GreedyRatioTest`][]).

    **Arguments:**

    - `verifier`: the [`eqx_specdec.Verifier`][], or a tree verifier built with its
        `tree` ([`eqx_specdec.TreeVerifier`][], [`eqx_specdec.TraversalVerifier`][]),
        or a verifier of a family of your own (see
        [`eqx_specdec.families.evaluation_family`][]).
    - `draft_probs`: `(G, V)`, or `None` for one-hot drafts (for a tree, `(N + 1, V)`:
        see [`eqx_specdec.evaluation.emission_by_quadrature`][]).
    - `target_probs`: `(G + 1, V)` (for a tree, `(N + 1, V)`).
    - `draft_law`: the law of the draft tokens; defaults to `draft_probs`.
    - `method`: `"quadrature"` (exact: for $V^G \\le 256$ and stages that implement
        `quadrature_breakpoints`; for trees of up to a few nodes), `"closed-form"`
        (exact at any vocabulary size, for a threshold rule's chain:
        [`eqx_specdec.evaluation.emission_in_closed_form`][]), `"monte-carlo"`, or `"auto"` (the
        default: quadrature where it applies, else the closed form where it applies,
        else Monte Carlo).
    - `num_draws`: Monte Carlo draws.
    - `key`: the Monte Carlo key; default `jax.random.key(0)`.

    **Returns:**

    An [`eqx_specdec.evaluation.Evaluation`][] (its fields say what is measured).

    **Raises:**

    - `ValueError`: when the verifier declares itself exact (`verifier.exact`) and
        measures lossy: an exact method's distance above 1e-4, or Monte Carlo counts
        the chi-square test rejects. The message holds the measurement; a declaration
        of exactness is never reported beside a loss.
    """
    methods = ("auto", "quadrature", "closed-form", "monte-carlo")
    if method not in methods:
        raise ValueError(
            f"`method` must be one of {', '.join(map(repr, methods))}, got {method!r}."
        )
    check_distributions(
        "evaluate_verifier",
        draft_probs=draft_probs,
        target_probs=target_probs,
        draft_law=draft_law,
    )
    p = np.asarray(target_probs, np.float64)
    q = None if draft_probs is None else np.asarray(draft_probs, np.float64)
    vocab = p.shape[1]
    family = evaluation_family(verifier)
    family.check_shape("evaluate_verifier")
    declared_exact = verifier.exact
    problem = family.quadrature_problem(q, p)
    closed_problem = closed_form_problem(verifier)
    if method == "quadrature" and problem is not None:
        raise problem
    if method == "closed-form" and closed_problem is not None:
        raise ValueError(f"evaluate_verifier: {closed_problem}")
    if method == "auto":
        method = (
            "quadrature"
            if problem is None
            else "closed-form"
            if closed_problem is None
            else "monte-carlo"
        )
    if method == "quadrature":
        estimate = emission_by_quadrature(verifier, q, p, draft_law=draft_law)
    elif method == "closed-form":
        estimate = emission_in_closed_form(verifier, q, p, draft_law=draft_law)
    else:
        key = jax.random.key(0) if key is None else key
        estimate = emission_by_monte_carlo(
            verifier, q, p, key, num_draws, draft_law=draft_law
        )
    accepted_law = estimate.accepted_distribution()
    reached = accepted_law[::-1].cumsum()[::-1]  # P(n >= k)
    target, depth = family.target(p, accepted_law)
    positions = estimate.reached > 0
    conditional = estimate.conditional()
    distances = [
        _total_variation(conditional[k], target[k]) if positions[k] else None
        for k in range(len(positions))
    ]
    accepted = float(reached[1:].sum())
    measured = [d for d in distances if d is not None]
    extra = {}
    if method == "monte-carlo":
        support = np.count_nonzero(target > 0, axis=-1)
        under = [
            bool(estimate.reached[k] < 5 * support[k]) for k in range(len(positions))
        ]
        measured = [d for d, u in zip(distances, under) if d is not None and not u]
        counts = np.arange(len(accepted_law))
        variance = accepted_law @ counts**2 - (accepted_law @ counts) ** 2
        extra = dict(
            tokens_per_step_error=float(np.sqrt(max(variance, 0.0) / num_draws)),
            distance_noise_per_position=_floats(estimate.distance_noise(target)),
            under_sampled=tuple(under),
        )
    fields = dict(
        method=method,
        gamma=depth,
        vocab=vocab,
        declared_exact=declared_exact,
        distance=max(measured) if measured else None,
        distance_per_position=tuple(distances),
        acceptance_rate=accepted / depth,
        tokens_per_step=1.0 + accepted,
        reached=tuple(float(r) for r in reached),
        **extra,
    )
    fields.update(family.extra_fields(q, p, float(reached[1])))
    if method == "monte-carlo":
        chi = estimate.chi_square(target)
        passed = np.all((chi["statistic"] < chi["threshold"])[positions])
        fields["draws"] = num_draws
        fields["chi_square"] = ChiSquare(
            _floats(chi["statistic"]),
            _floats(chi["df"]),
            _floats(chi["threshold"]),
            bool(passed),
        )
    evaluation = Evaluation(**fields)
    _hold_to_claim(verifier, evaluation)
    return evaluation


def _hold_to_claim(verifier, evaluation: Evaluation) -> None:
    """Raises when a verifier that declares itself exact measures lossy."""
    if not evaluation.declared_exact:
        return
    if evaluation.method == "monte-carlo":
        if evaluation.chi_square.passed:
            return
        how = (
            f"Monte Carlo counts ({evaluation.draws} draws) that the chi-square test "
            "rejects"
        )
    else:
        if evaluation.distance is None or evaluation.distance <= EXACT_TOLERANCE:
            return
        how = (
            f"a distance from the target of {evaluation.distance:.4g} by "
            f"{evaluation.method} (tolerance {EXACT_TOLERANCE:g})"
        )
    raise ValueError(
        f"evaluate_verifier: {type(verifier).__name__} declares itself exact, but "
        f"evaluate_verifier measured {how}: the declaration is false. A threshold "
        "rule is exact only where its accepted mass min(q, t) stays at most p; a "
        "stage whose correction does not see the test's parameters is lossy. Fix the "
        f"rule, or declare `exact = False`.\n{evaluation}"
    )
