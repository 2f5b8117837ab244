"""A verifier family of one's own, joined through the public registries of
`eqx_specdec.families`: `verify` compiles and checks it as it does the library's chains,
and the evaluation tools measure it."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import message_line

import eqx_specdec as es
from eqx_specdec import families


class GreedyChain(eqx.Module):
    """Greedy verification of a chain written in a few lines of JAX, with no stages:
    draft tokens are kept while each is the target's most likely token, then the target's
    most likely token follows."""

    exact = True


@families.verification_step.register
def _(verifier: GreedyChain, target, draft, randomness, options):
    p = target.probs
    best = jnp.argmax(p, axis=-1).astype(jnp.int32)  # (B, G + 1)
    gamma = draft.tokens.shape[1]
    passed = draft.tokens == best[:, :gamma]
    n = jnp.sum(jnp.cumprod(passed, axis=1), axis=1).astype(jnp.int32)
    position = jnp.arange(gamma + 1)[None]
    kept = jnp.concatenate([draft.tokens, best[:, -1:]], axis=1)
    tokens = jnp.where(position < n[:, None], kept, -1)
    tokens = jnp.where(
        position == n[:, None], best[jnp.arange(len(n)), n][:, None], tokens
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


@families.evaluation_family.register
def _(verifier: GreedyChain):
    # Measured as the library's greedy chain would be: the same law.
    return families.evaluation_family(es.Verifier(es.GreedyRatioTest()))


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


def test_a_family_is_measured_by_the_evaluation_tools():
    _, q, p, _, _ = es.example_inputs(batch=1, gamma=2, vocab=3, seed=1)
    evaluation = es.evaluation.evaluate_verifier(GreedyChain(), q[0], p[0])
    assert evaluation.method == "quadrature"
    assert evaluation.declared_exact and evaluation.distance < 1e-6
