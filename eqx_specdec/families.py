"""Verifier families: the open registries through which the library's entry points
reach a kind of verifier (chains and trees are the library's two families).

A family of your own is a verifier class of its own that is not a chain or tree
verifier. It joins the library by registering a function of its class on each
registry it needs, as Lineax's operators join its tag functions:

- [`eqx_specdec.families.verification_step`][]: what [`eqx_specdec.verify`][] (and
    so [`eqx_specdec.speculative_accept`][]) runs for it;
- [`eqx_specdec.families.default_proposal`][]: what
    [`eqx_specdec.speculative_decode`][] drafts for it when no proposal is given;
- [`eqx_specdec.families.evaluation_family`][]: how
    [`eqx_specdec.evaluation.evaluate_verifier`][] and the emission estimators measure it.
"""

from ._entry.entry import (
    StepOptions as StepOptions,
    verification_step as verification_step,
)
from ._evaluation.families import (
    AbstractEvaluationFamily as AbstractEvaluationFamily,
    evaluation_family as evaluation_family,
)
from ._inputs.results import Problem as Problem
from ._proposal.abstract_proposal import default_proposal as default_proposal
