"""`eqx_specdec.verify`, the one compiled entry point over typed inputs: the contract's
conveniences are it (bit for bit), its result module and code (`throw=False`), its
errors naming the argument, and the error classes on every path with one device."""

import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import default_xla_environment, random_case

import eqx_specdec as es


B, G, V = 5, 3, 7
X, Q, P, U, S = (jnp.asarray(a) for a in random_case(3, B, G, V))
PARENTS = jnp.tile(jnp.asarray([-1, -1, 0], jnp.int32), (B, 1))
TREE_Q = jnp.concatenate([Q, Q[:, :1]], axis=1)


def _same(verification, expected: dict):
    got = verification.as_dict()
    assert got.keys() == expected.keys()
    for name in got:
        np.testing.assert_array_equal(got[name], expected[name])


def test_the_conveniences_are_verify_bit_for_bit():
    chain = es.Draft(X, es.Probabilities(Q))
    uniforms = es.Uniforms(U, S)
    _same(
        es.verify(es.Probabilities(P), chain, uniforms),
        es.speculative_accept(X, Q, P, U, S),
    )
    logprobs = es.LogProbs(raw=True, top_k=2)
    warp = es.Warp(0.7, top_k=4)
    _same(
        es.verify(
            es.Logits(jnp.log(P), warp),
            es.Draft(X, es.Logits(jnp.log(Q), es.Warp(0.7))),
            uniforms,
            logprobs=logprobs,
        ),
        es.speculative_accept_logits(
            X,
            jnp.log(Q),
            jnp.log(P),
            U,
            S,
            target_warp=warp,
            draft_warp=es.Warp(0.7),
            logprobs=logprobs,
        ),
    )
    key = jax.random.key(4)
    _same(
        es.verify(es.Probabilities(P), chain, key),
        es.speculative_accept_from_key(key, X, Q, P),
    )
    tree = es.TreeVerifier()
    _same(
        es.verify(
            es.Probabilities(P[:, :4]),
            es.Draft(X, es.Probabilities(TREE_Q), PARENTS),
            uniforms,
            verifier=tree,
        ),
        es.tree_accept(X, PARENTS, TREE_Q, P[:, :4], U, S, verifier=tree),
    )


def test_the_result_module_holds_what_was_asked():
    chain = es.Draft(X, es.Probabilities(Q))
    plain = es.verify(es.Probabilities(P), chain, es.Uniforms(U, S))
    assert isinstance(plain, es.Verification) and plain.path is None
    assert plain.logprobs is None and int(plain.result) == 0
    assert plain.tokens.dtype == plain.num_accepted.dtype == jnp.int32
    asked = es.verify(
        es.Probabilities(P), chain, es.Uniforms(U, S), logprobs=es.LogProbs(top_k=3)
    )
    assert asked.logprobs.shape == (B, G + 1) and asked.top_tokens.shape == (
        B,
        G + 1,
        3,
    )
    tree = es.verify(
        es.Probabilities(P[:, :4]),
        es.Draft(X, es.Probabilities(TREE_Q), PARENTS),
        es.Uniforms(U, S),
        verifier=es.TraversalVerifier(),
    )
    assert tree.path.shape == (B, 3)


def _bad_target():
    return P.at[2, 1].set(P[2, 1] * 3)  # row 2's distribution sums to 3


@pytest.mark.parametrize(
    "wrap", [lambda f: f, eqx.filter_jit, jax.jit], ids=["direct", "filter_jit", "jit"]
)
def test_throw_false_returns_the_result_code_on_every_path(wrap):
    args = (es.Probabilities(_bad_target()), es.Draft(X, es.Probabilities(Q)))

    def run(randomness):
        return es.verify(*args, randomness, check_inputs="all", throw=False)

    out = wrap(run)(es.Uniforms(U, S))
    assert int(out.result) > 0 and int(out.failed_row) == 2
    message = out.error_message()
    assert message.startswith("`target_probs` has a distribution whose sum")
    assert "in row 2" in message
    with pytest.raises(es.InvalidInputError) as raised:
        es.verify(*args, es.Uniforms(U, S), check_inputs="all")
    assert str(raised.value) == message
    valid = es.verify(es.Probabilities(P), args[1], es.Uniforms(U, S), throw=False)
    assert int(valid.result) == 0 and valid.error_message() is None


def test_wrong_kinds_are_named():
    draft = es.Draft(X, es.Probabilities(Q))
    with pytest.raises(TypeError, match=r"verify\(`target`=\.\.\.\) must be"):
        es.verify(P, draft, es.Uniforms(U, S))
    with pytest.raises(TypeError, match="give both the same way"):
        es.verify(es.Logits(P), draft, es.Uniforms(U, S))
    with pytest.raises(TypeError, match=r"`randomness`=\.\.\.\) must be"):
        es.verify(es.Probabilities(P), draft, (U, S))
    with pytest.raises(TypeError, match=r"Draft\(`distribution`=\.\.\.\)"):
        es.Draft(X, Q)
    tree_draft = es.Draft(X, es.Probabilities(Q), PARENTS)
    with pytest.raises(ValueError, match="has `parents`, the shape of a tree"):
        es.verify(
            es.Probabilities(P), tree_draft, es.Uniforms(U, S), verifier=es.Verifier()
        )
    with pytest.raises(TypeError, match="pass the tree verifier to run"):
        es.verify(es.Probabilities(P), tree_draft, es.Uniforms(U, S))


ONE_DEVICE = r"""
import jax, numpy as np, equinox as eqx, eqx_specdec as es
assert jax.device_count() == 1
x, q, p, u, s = (np.array(a) for a in es.example_inputs(batch=4, gamma=3, vocab=10))
p[2] = p[2] * 3
check = lambda *a: es.speculative_accept(*a, check_inputs="all")
paths = {
    "direct": check,
    "eqx.filter_jit": eqx.filter_jit(check),
    "vmap": lambda *a: jax.vmap(check)(*(np.stack([v, v]) for v in a)),
}
for name, run in paths.items():
    for call in range(2):  # a first call, and one through the fast dispatch path
        try:
            jax.block_until_ready(run(x, q, p, u, s))
        except eqx.EquinoxRuntimeError as error:  # one clause for every path
            assert "`target_probs` has a distribution whose sum" in str(error)
            assert "in row 2 (the first such row)" in str(error)
            assert (type(error) is es.InvalidInputError) == (name == "direct"), name
        else:
            raise AssertionError(f"{name}: no error")
jax.effects_barrier()  # nothing lingers
print("ok")
"""


def test_one_device_paths_raise_equinox_errors_that_do_not_linger():
    """With one device, the check inside a caller's trace is Equinox's
    `branched_error_if`: `except eqx.EquinoxRuntimeError` catches the error on the
    direct call, under `eqx.filter_jit` and under `jax.vmap`, with the row named, and
    no error is left for a later `jax.effects_barrier()`. (This suite runs with eight
    host devices, where the check is a debug callback: a fresh interpreter.)"""
    env = default_xla_environment()
    out = subprocess.run(
        [sys.executable, "-c", ONE_DEVICE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_a_tree_draws_its_randomness_from_a_key_as_uniforms_from_key_says():
    """With a key, row b of a tree uses `fold_in(key, b)` alone, drawn as
    `uniforms_from_key` draws a chain's (one accept uniform per node)."""
    key = jax.random.key(11)
    tree = es.Draft(X, es.Probabilities(TREE_Q), PARENTS)
    accept, sample = es.uniforms_from_key(key, B, X.shape[1])
    _same(
        es.verify(es.Probabilities(P[:, :4]), tree, key, verifier=es.TreeVerifier()),
        es.verify(
            es.Probabilities(P[:, :4]),
            tree,
            es.Uniforms(accept, sample),
            verifier=es.TreeVerifier(),
        ).as_dict(),
    )
