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
from helpers import (
    accept_from_key,
    accept_logits,
    default_xla_environment,
    random_case,
    tree_accept,
)

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
        accept_logits(
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
        accept_from_key(key, X, Q, P),
    )
    tree = es.TreeVerifier()
    _same(
        es.verify(
            es.Probabilities(P[:, :4]),
            es.Draft(X, es.Probabilities(TREE_Q), PARENTS),
            uniforms,
            verifier=tree,
        ),
        tree_accept(X, PARENTS, TREE_Q, P[:, :4], U, S, verifier=tree),
    )


def test_the_result_module_holds_what_was_asked():
    chain = es.Draft(X, es.Probabilities(Q))
    plain = es.verify(es.Probabilities(P), chain, es.Uniforms(U, S))
    assert isinstance(plain, es.Verification) and plain.path is None
    assert plain.logprobs is None and bool(plain.result == es.RESULTS.successful)
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
    assert bool(out.result == es.RESULTS.not_normalised) and int(out.failed_row) == 2
    message = out.error_message()
    assert message.startswith("`target_probs` has a distribution whose sum")
    assert "in row 2" in message
    with pytest.raises(RuntimeError) as raised:
        jax.block_until_ready(es.verify(*args, es.Uniforms(U, S), check_inputs="all"))
    assert message in str(raised.value)
    valid = es.verify(es.Probabilities(P), args[1], es.Uniforms(U, S), throw=False)
    assert bool(valid.result == es.RESULTS.successful)
    assert valid.error_message() is None


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


def test_a_numpy_input_changed_after_it_is_given_changes_nothing():
    """A NumPy array given to a typed input is copied in: a caller reusing its buffer
    afterwards changes nothing. (On the CPU, JAX may read a NumPy array put on the
    device as it is after the call has returned, or share its memory: about half of
    these sixteen views would see the change.)"""
    rng = np.random.default_rng(0)
    buffer = rng.random(16 + 2 * 4 * 50_000).astype(np.float32)
    views = [buffer[i : i + 400_000].reshape(2, 4, 50_000) for i in range(16)]
    expected = [view.copy() for view in views]
    given = [es.Logits(view) for view in views]
    buffer[...] = 0
    for typed, want in zip(given, expected):
        assert isinstance(typed.logits, jax.Array)
        np.testing.assert_array_equal(np.asarray(typed.logits), want)


ONE_DEVICE = r"""
import os, jax, numpy as np, equinox as eqx, eqx_specdec as es
assert jax.device_count() == 1
x, q, p, u, s = (np.array(a) for a in es.example_inputs(batch=4, gamma=3, vocab=10))
bad_p, bad_x = p.copy(), x.copy()
bad_p[2] = bad_p[2] * 3
bad_x[1, 0] = 10
check = lambda *a: es.speculative_accept(*a, check_inputs="all")
paths = {
    "direct": check,
    "jax.jit": jax.jit(check),
    "eqx.filter_jit": eqx.filter_jit(check),
    "vmap": lambda *a: jax.vmap(check)(*(np.stack([v, v]) for v in a)),
}
raised = 0
for name, run in paths.items():
    # A valid call first, then bad values through the fast dispatch path.
    jax.block_until_ready(run(x, q, p, u, s))
    for args, text in (
        ((x, q, bad_p, u, s), "`target_probs` has a distribution whose sum"),
        ((bad_x, q, p, u, s), "`draft_tokens` holds a token id outside"),
    ):
        try:
            jax.block_until_ready(run(*args))
        except (RuntimeError, ValueError) as error:  # one clause for every path
            assert text in str(error), (name, str(error)[-500:])
            assert " in row " in str(error)
            # Equinox's error, but through a plain jax.jit's fast dispatch: JAX's.
            equinox = isinstance(error, eqx.EquinoxRuntimeError)
            assert equinox == (name != "jax.jit"), (name, type(error))
            raised += 1
        else:
            if os.environ.get("EQX_ON_ERROR") != "nan":
                raise AssertionError(f"{name}: no error")
jax.effects_barrier()  # nothing lingers
verification = es.verify(
    es.Probabilities(bad_p), es.Draft(x, es.Probabilities(q)), es.Uniforms(u, s)
    , throw=False
)
assert bool(verification.result == es.RESULTS.not_normalised)
print("ok", raised)
"""


@pytest.mark.parametrize("on_error", ["raise", "nan"])
def test_one_device_paths_raise_one_error_class_that_does_not_linger(on_error):
    """With one device, a bad value raises Equinox's `EquinoxRuntimeError` naming the
    argument and the row (direct, `eqx.filter_jit`, `jax.vmap`), or JAX's own error
    holding the same message inside a caller's plain `jax.jit` (on NumPy inputs after
    a valid call: `ValueError`, JAX's fast dispatch); none is left for a later
    `jax.effects_barrier()`, and `EQX_ON_ERROR=nan` turns raising off while the result
    still names the problem. (This suite runs with eight host devices: a fresh
    interpreter.)"""
    env = default_xla_environment() | {"EQX_ON_ERROR": on_error}
    out = subprocess.run(
        [sys.executable, "-c", ONE_DEVICE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok 8" if on_error == "raise" else "ok 0")


def test_a_tree_draws_its_randomness_from_a_key_as_uniforms_from_key_draws():
    """With a key, row b of a tree uses `fold_in(key, b)` alone, drawn as
    `Uniforms.from_key` draws a chain's (one accept uniform per node)."""
    key = jax.random.key(11)
    tree = es.Draft(X, es.Probabilities(TREE_Q), PARENTS)
    drawn = es.Uniforms.from_key(key, B, X.shape[1])
    _same(
        es.verify(es.Probabilities(P[:, :4]), tree, key, verifier=es.TreeVerifier()),
        es.verify(
            es.Probabilities(P[:, :4]),
            tree,
            drawn,
            verifier=es.TreeVerifier(),
        ).as_dict(),
    )
