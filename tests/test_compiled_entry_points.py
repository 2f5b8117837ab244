"""The entry points, compiled with `eqx.filter_jit`, are sound: no tracer outlives its
trace (every entry point under `jax.checking_leaks()` inside a caller's `jax.jit`,
`jax.vmap` and `jax.grad`), and they may be called from several threads at once."""

import contextlib
import gc
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import accept_from_key, accept_logits, random_case, tree_accept

import eqx_specdec as es


B, G, V = 3, 2, 6
X, Q, P, U, S = random_case(11, B, G, V)
PARENTS = np.tile(np.arange(-1, G - 1), (B, 1)).astype(np.int32)
TREE_Q = np.concatenate([Q, Q[:, -1:]], axis=1)


def _lenient(lenience):
    return es.Verifier(es.LenientRatioTest(lenience))


# Each entry point as a function of one traced float, the lenience of its rule (or the
# scale of its logits), returning a float so that `jax.grad` applies.
def _accept(lenience):
    out = es.speculative_accept(X, Q, P, U, S, verifier=_lenient(lenience))
    return lenience * out["num_accepted"].sum().astype(jnp.float32)


def _logits(scale):
    warp = es.Warp(temperature=0.7)
    out = accept_logits(
        X, scale * jnp.log(Q), scale * jnp.log(P), U, S, target_warp=warp
    )
    return scale * out["num_accepted"].sum().astype(jnp.float32)


def _from_key(lenience):
    key = jax.random.key(0)
    out = accept_from_key(key, X, Q, P, verifier=_lenient(lenience))
    return lenience * out["num_accepted"].sum().astype(jnp.float32)


def _tree(scale):
    rule = es.TreeVerifier(es.IIDCandidates())
    out = tree_accept(X, PARENTS, TREE_Q, P, U * scale, S, verifier=rule)
    return scale * out["num_accepted"].sum().astype(jnp.float32)


def _objective(lenience):
    return es.evaluation.expected_accepted_length(
        Q, P, verifier=_lenient(lenience)
    ).sum()


@contextlib.contextmanager
def tracers_left_behind():
    """Yields a list that holds, after the block, the tracers the block left alive.

    Only the block's own objects are searched: the worker's other objects (hundreds of
    thousands after a few modules, where collecting and listing them took about 0.6 s
    a test) are frozen out of the collector for the block, and a tracer the block
    makes is never among them."""
    left = []
    gc.freeze()
    try:
        yield left
        gc.collect()
        left.extend(o for o in gc.get_objects() if isinstance(o, jax.core.Tracer))
    finally:
        gc.unfreeze()


ENTRY_POINTS = {
    "speculative_accept": _accept,
    "speculative_accept_logits": _logits,
    "speculative_accept_from_key": _from_key,
    "tree_accept": _tree,
    "expected_accepted_length": _objective,
}
TRANSFORMS = {
    "jit": lambda f: jax.jit(f)(jnp.float32(0.9)),
    "vmap": lambda f: jax.vmap(f)(jnp.asarray([0.9, 1.0], jnp.float32)),
    "grad": lambda f: jax.grad(f)(jnp.float32(0.9)),
}


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_no_tracer_outlives_a_callers_trace(entry, transform):
    """After the caller's trace, no tracer is alive. (Counted with the garbage
    collector: `jax.checking_leaks()` reports Equinox's own `error_if`, whose traceback
    frames hold the trace's tracers until they are collected.)"""
    function = ENTRY_POINTS[entry]
    eager = function(jnp.float32(0.9))
    with tracers_left_behind() as left:
        result = TRANSFORMS[transform](function)
    assert not left
    if transform == "jit":
        np.testing.assert_allclose(result, eager, rtol=1e-6)
    # After the trace, a plain call still dispatches.
    np.testing.assert_allclose(function(jnp.float32(0.9)), eager, rtol=1e-6)


def _tiny_models():
    draft = es.demo.NGramModel(jnp.full((1, V), 1.0 / V, jnp.float32), order=1)
    target = es.demo.NGramModel(jnp.asarray(P[0, :1], jnp.float32), order=1)
    return draft, target


def test_the_decoding_loop_leaks_no_tracer_under_a_callers_jit():
    draft, target = _tiny_models()

    def tokens(lenience):
        result = es.speculative_decode(
            draft,
            target,
            jnp.zeros((2, 1), jnp.int32),
            None,
            3,
            jax.random.key(1),
            verifier=_lenient(lenience),
            proposal=es.Chain(2),
        )
        return result.tokens

    eager = tokens(jnp.float32(1.0))
    with tracers_left_behind() as left:
        traced = jax.jit(tokens)(jnp.float32(1.0))
    assert not left
    np.testing.assert_array_equal(traced, eager)


def test_an_entry_point_may_be_called_from_several_threads():
    verifiers = [_lenient(jnp.float32(0.25 * k)) for k in range(1, 5)]
    expected = [
        np.asarray(es.speculative_accept(X, Q, P, U, S, verifier=v)["tokens"])
        for v in verifiers
    ]
    failures = []

    def work(seed):
        for step in range(40):
            k = (seed + step) % len(verifiers)
            # Fresh modules too, so that the remembered ones are replaced as others read.
            verifier = (
                verifiers[k] if step % 2 else _lenient(verifiers[k].ratio_test.lenience)
            )
            out = es.speculative_accept(X, Q, P, U, S, verifier=verifier)
            if not np.array_equal(np.asarray(out["tokens"]), expected[k]):
                failures.append((seed, step))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
