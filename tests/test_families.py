"""A verifier family of one's own, joined through the public registries of
`eqx_specdec.families`: `verify` compiles and checks it as it does the library's chains,
and the evaluation tools measure it."""

import itertools

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import message_line

import eqx_specdec as es
from eqx_specdec import families
from eqx_specdec.evaluation import EmissionEstimate


class GreedyChain(eqx.Module):
    """Greedy verification of a chain written in a few lines of JAX, with no stages:
    draft tokens are kept while each is the target's most likely token, then the target's
    most likely token follows. `rank=1` corrects with the second most likely instead: a
    lossy control."""

    rank: int = eqx.field(static=True, default=0)

    @property
    def exact(self) -> bool:
        return self.rank == 0


@families.verification_step.register
def _(verifier: GreedyChain, target, draft, randomness, options):
    p = target.probs
    best = jnp.argmax(p, axis=-1).astype(jnp.int32)  # (B, G + 1)
    ranked = jnp.argsort(-p, axis=-1)[..., verifier.rank].astype(jnp.int32)
    gamma = draft.tokens.shape[1]
    passed = draft.tokens == best[:, :gamma]
    n = jnp.sum(jnp.cumprod(passed, axis=1), axis=1).astype(jnp.int32)
    position = jnp.arange(gamma + 1)[None]
    kept = jnp.concatenate([draft.tokens, best[:, -1:]], axis=1)
    tokens = jnp.where(position < n[:, None], kept, -1)
    tokens = jnp.where(
        position == n[:, None], ranked[jnp.arange(len(n)), n][:, None], tokens
    )
    problems = []
    if options.check_inputs != "off":
        bad = ~jnp.all(jnp.isfinite(p), axis=(1, 2))
        problems.append(
            families.Problem(
                bad,
                es.RESULTS.invalid_probability,
                "`target` holds a NaN in row {row}: pass finite probabilities.",
            )
        )
    return {"num_accepted": n, "tokens": tokens.astype(jnp.int32)}, problems


class GreedyChainEvaluation(families.AbstractEvaluationFamily):
    """The family measured by exact enumeration: a greedy verifier draws no randomness,
    so its emission is a weighted sum over the V^G draft chains, each verified by the
    family's own step."""

    verifier: GreedyChain

    def quadrature(self, draft_probs, target_probs, *, draft_law=None, **options):
        law = draft_probs if draft_law is None else draft_law
        gamma, vocab = law.shape
        drafts = np.array(list(itertools.product(range(vocab), repeat=gamma)))
        weights = np.prod(law[np.arange(gamma), drafts], axis=1)
        p = np.broadcast_to(target_probs, (len(drafts),) + target_probs.shape)
        out = es.verify(
            es.Probabilities(jnp.asarray(p, jnp.float32)),
            es.Draft(jnp.asarray(drafts, jnp.int32)),
            es.Uniforms(),
            verifier=self.verifier,
        )
        tokens = np.asarray(out.tokens)
        emitted = np.zeros((gamma + 1, vocab))
        for k in range(gamma + 1):
            reached = tokens[:, k] >= 0
            np.add.at(emitted[k], tokens[reached, k], weights[reached])
        return EmissionEstimate(emitted, emitted.sum(-1))

    def monte_carlo(self, draft_probs, target_probs, key, num_draws, **options):
        raise NotImplementedError("exact enumeration only")

    def check_shape(self, tool):
        return None

    def quadrature_problem(self, q, p):
        return None

    def target(self, p, accepted_law):
        return np.eye(p.shape[-1])[np.argmax(p, -1)], p.shape[0] - 1  # greedy decoding

    def extra_fields(self, q, p, root_acceptance):
        return {}


@families.evaluation_family.register
def _(verifier: GreedyChain):
    return GreedyChainEvaluation(verifier)


def _inputs():
    _, _, p, _, _ = es.example_inputs(batch=6, gamma=3, vocab=7, seed=3)
    best = jnp.argmax(p, -1).astype(jnp.int32)
    # Rows keep 3, 0, 1, 2, 3 and 0 draft tokens.
    wrong = (best + 1) % 7
    lengths = jnp.array([3, 0, 1, 2, 3, 0])
    x = jnp.where(jnp.arange(3)[None] < lengths[:, None], best[:, :3], wrong[:, :3])
    return x, p


def test_a_family_of_ones_own_runs_through_verify_as_the_library_s_own():
    x, p = _inputs()
    ours = es.verify(
        es.Probabilities(p), es.Draft(x), es.Uniforms(), verifier=GreedyChain()
    )
    library = es.verify(
        es.Probabilities(p),
        es.Draft(x),
        es.Uniforms(),
        verifier=es.Verifier(es.GreedyRatioTest()),
    )
    np.testing.assert_array_equal(ours.num_accepted, [3, 0, 1, 2, 3, 0])
    np.testing.assert_array_equal(ours.tokens, library.tokens)
    assert ours.result == es.RESULTS.successful


def test_a_family_s_problems_are_results_and_errors_as_the_library_s():
    x, p = _inputs()
    p = p.at[4, 2, 1].set(jnp.nan)
    found = es.verify(
        es.Probabilities(p),
        es.Draft(x),
        es.Uniforms(),
        verifier=GreedyChain(),
        throw=False,
    )
    assert found.result == es.RESULTS.invalid_probability
    assert int(found.failed_row) == 4
    with pytest.raises(RuntimeError) as raised:
        es.verify(
            es.Probabilities(p), es.Draft(x), es.Uniforms(), verifier=GreedyChain()
        )
    assert "row 4" in message_line(raised.value)


def test_a_family_is_measured_by_the_evaluation_tools_and_its_lossy_control_caught():
    _, q, p, _, _ = es.example_inputs(batch=1, gamma=2, vocab=3, seed=1)
    exact = es.evaluation.evaluate_verifier(GreedyChain(), q[0], p[0])
    assert exact.method == "quadrature" and exact.declared_exact
    assert exact.distance < 1e-6
    lossy = es.evaluation.evaluate_verifier(GreedyChain(rank=1), q[0], p[0])
    assert not lossy.declared_exact and lossy.distance > 0.5
