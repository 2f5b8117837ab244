"""What the evaluation tools do that depends on the verifier's family (chains, trees,
or one of your own), chosen by the open registry `evaluation_family`."""

import abc
import functools

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._capabilities import has_capability
from .._chain.abstract_verifier import AbstractVerifier
from .._errors import MissingCapabilityError
from .._tree.abstract_tree_verifier import AbstractTreeVerifier, tree_of
from .chain_emission import chain_monte_carlo, chain_quadrature, stage_breakpoints
from .emission import EmissionEstimate
from .tree_evaluation import (
    tree_emission_by_monte_carlo,
    tree_emission_by_quadrature,
    tree_quadrature_problem,
)


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
        return chain_quadrature(self.verifier, draft_probs, target_probs, **options)

    def monte_carlo(self, draft_probs, target_probs, key, num_draws, **options):
        return chain_monte_carlo(
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
