"""Measuring a verifier: its emission law (exact quadrature, closed forms, Monte
Carlo) against its target, its acceptance as a differentiable objective, the best
acceptance any verifier of a tree can reach, and a decoding loop's wall-clock
speed-up."""

from ._decoding.speedup import measure_speedup as measure_speedup, Speedup as Speedup
from ._evaluation.closed_form import (
    emission_in_closed_form as emission_in_closed_form,
)
from ._evaluation.emission import EmissionEstimate as EmissionEstimate
from ._evaluation.evaluate import (
    ChiSquare as ChiSquare,
    evaluate_verifier as evaluate_verifier,
    Evaluation as Evaluation,
    synthetic_distributions as synthetic_distributions,
)
from ._evaluation.lossless import (
    emission_by_monte_carlo as emission_by_monte_carlo,
    emission_by_quadrature as emission_by_quadrature,
)
from ._evaluation.objectives import (
    acceptance_by_position as acceptance_by_position,
    expected_accepted_length as expected_accepted_length,
)
from ._tree.optimal import optimal_acceptance as optimal_acceptance
