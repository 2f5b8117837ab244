"""Equinox filter semantics at every entry point: array leaves traced, every other leaf
static, so stages with Python `bool`, `int`, `str` and tuple fields used in Python
control flow work eagerly, under `jax.jit`, `eqx.filter_jit`, `jax.vmap` and
`eqx.filter_vmap` over a stacked module."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import accept_from_key, accept_logits, random_case
from user_stages import page_classes, SwitchedRatioTest, TopKArgmaxSampler

import eqx_specdec as es


# The rule of "Your own variant in 30 lines", as the page defines it.
RecycledUniformTest = page_classes("your_own_variant.md")["RecycledUniformTest"]

GREEDY_CORRECTION = es.Verifier(
    residual_sampler=es.ArgmaxSampler(), allow_mismatch=True
)

# (user verifier, the library verifier it must equal, the largest count it allows)
CASES = [
    (es.Verifier(SwitchedRatioTest("ratio"), residual_sampler=TopKArgmaxSampler(3)), 5),
    (es.Verifier(SwitchedRatioTest("division"), residual_sampler=TopKArgmaxSampler(1)), 5),
    (es.Verifier(SwitchedRatioTest(rejected_positions=(1,)), residual_sampler=TopKArgmaxSampler()), 1),
]  # fmt: skip
IDS = ["str field", "str and int fields", "tuple field"]


def _inputs():
    return random_case(5, 24, 5, 40)


def _expected(limit):
    x, q, p, u, s = _inputs()
    out = es.speculative_accept(x, q, p, u, s, verifier=GREEDY_CORRECTION)
    n = np.minimum(np.asarray(out["num_accepted"]), limit)
    return n


def _check(out, limit):
    np.testing.assert_array_equal(np.asarray(out["num_accepted"]), _expected(limit))
    # The correction is the target's argmax at row n (what TopKArgmaxSampler draws).
    x, _, p, _, _ = _inputs()
    n = np.asarray(out["num_accepted"])
    best = np.argmax(p[np.arange(len(n)), n], -1)
    np.testing.assert_array_equal(np.asarray(out["tokens"])[np.arange(len(n)), n], best)


@pytest.mark.parametrize("verifier, limit", CASES, ids=IDS)
def test_eagerly(verifier, limit):
    _check(es.speculative_accept(*_inputs(), verifier=verifier), limit)


@pytest.mark.parametrize("verifier, limit", CASES, ids=IDS)
def test_under_a_users_jax_jit(verifier, limit):
    run = jax.jit(lambda *a: es.speculative_accept(*a, verifier=verifier))
    _check(run(*_inputs()), limit)


@pytest.mark.parametrize("verifier, limit", CASES, ids=IDS)
def test_under_a_users_filter_jit_with_the_verifier_as_argument(verifier, limit):
    run = eqx.filter_jit(lambda v, *a: es.speculative_accept(*a, verifier=v))
    _check(run(verifier, *_inputs()), limit)


@pytest.mark.parametrize("verifier, limit", CASES, ids=IDS)
def test_under_vmap_over_an_extra_axis(verifier, limit):
    stacked = [np.stack([a, a]) for a in _inputs()]
    out = jax.vmap(lambda *a: es.speculative_accept(*a, verifier=verifier))(*stacked)
    for i in range(2):
        _check({k: v[i] for k, v in out.items()}, limit)


def test_from_key_and_logits_entry_points_take_python_fields():
    x, q, p, _, _ = _inputs()
    verifier = es.Verifier(
        SwitchedRatioTest("ratio"), residual_sampler=TopKArgmaxSampler(2)
    )
    out = accept_from_key(jax.random.key(0), x, q, p, verifier=verifier)
    reference = accept_from_key(jax.random.key(0), x, q, p, verifier=GREEDY_CORRECTION)
    np.testing.assert_array_equal(out["tokens"], reference["tokens"])
    # A Warp with a Python int top_k and float temperature: static fields.
    logits = np.log(p)
    got = accept_logits(
        x, None, logits, *random_case(5, 24, 5, 40)[3:],
        target_warp=es.Warp(0.7, top_k=5),
    )  # fmt: skip
    again = jax.jit(lambda *a: accept_logits(*a, target_warp=es.Warp(0.7, top_k=5)))(
        x, None, logits, *random_case(5, 24, 5, 40)[3:]
    )
    np.testing.assert_array_equal(got["tokens"], again["tokens"])


def test_filter_vmap_over_a_stacked_verifier():
    """A verifier with an array field (lenience) and a Python field (k), stacked over
    its array leaves, mapped with `eqx.filter_vmap`: row i equals verifier i alone."""
    lenience = jnp.asarray([0.4, 0.7, 1.0])

    def make(value):
        return es.Verifier(
            es.LenientRatioTest(value), residual_sampler=TopKArgmaxSampler(2)
        )

    stacked = eqx.filter_vmap(make)(lenience)
    x, q, p, u, s = _inputs()
    out = eqx.filter_vmap(lambda v: es.speculative_accept(x, q, p, u, s, verifier=v))(
        stacked
    )
    for i, value in enumerate(lenience):
        alone = es.speculative_accept(x, q, p, u, s, verifier=make(value))
        np.testing.assert_array_equal(out["tokens"][i], alone["tokens"])
    counts = np.asarray(out["num_accepted"]).mean(1)
    assert counts[0] > counts[2]  # more lenience, more accepted


def test_the_docs_recycled_uniform_test_runs_through_the_entry_point():
    """The bool field of your_own_variant.md's rule steers Python control flow."""
    x, q, p, u, s = _inputs()
    for rescale in (True, False):
        verifier = es.Verifier(RecycledUniformTest(rescale))
        out = es.speculative_accept(x, q, p, u, s, verifier=verifier)
        assert out["tokens"].shape == (24, 6)


class _Counter:
    """A hashable (by identity) counter, held in a static field."""

    def __init__(self):
        self.count = 0


class _CountingTest(es.AbstractRatioTest):
    """The standard test, counting its traces."""

    exact: ClassVar[bool] = True
    traces: _Counter = eqx.field(static=True, default_factory=_Counter)

    def __call__(
        self, draft_tokens, draft_probs, target_probs, accept_uniforms, context
    ):
        self.traces.count += 1
        return es.RatioTest()(
            draft_tokens, draft_probs, target_probs, accept_uniforms, context
        )


def test_compiled_once_per_static_configuration():
    test = _CountingTest()
    verifier = es.Verifier(test)
    for seed in range(3):  # new values, same shapes and static fields: no retrace
        es.speculative_accept(*random_case(seed, 4, 3, 10), verifier=verifier)
    assert test.traces.count == 1
    # `speculative_accept` is `verify` on typed inputs: the same program.
    x, q, p, u, s = random_case(5, 4, 3, 10)
    es.verify(
        es.Probabilities(p),
        es.Draft(x, es.Probabilities(q)),
        es.Uniforms(u, s),
        verifier=verifier,
    )
    assert test.traces.count == 1
    es.speculative_accept(
        *random_case(0, 4, 3, 10), verifier=verifier, check_inputs="off"
    )
    assert test.traces.count == 2  # another static configuration


def test_an_unhashable_static_field_is_a_clear_error():
    class Unhashable:
        __hash__ = None

    class Holder(es.AbstractRatioTest):
        exact: ClassVar[bool] = True
        thing: object

        def __call__(
            self, draft_tokens, draft_probs, target_probs, accept_uniforms, context
        ):
            return es.RatioTest()(
                draft_tokens, draft_probs, target_probs, accept_uniforms, context
            )

    with pytest.raises(TypeError, match="neither an array nor hashable"):
        es.speculative_accept(*_inputs(), verifier=es.Verifier(Holder(Unhashable())))
