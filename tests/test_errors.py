"""Wrong ranks, shapes and dtypes fail at trace time with messages naming the argument."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import pytest
from helpers import random_case

import eqx_specdec


B, G, V = 3, 4, 10


def _inputs():
    x, q, p, u, s = random_case(0, B, G, V)
    return dict(
        draft_tokens=jnp.asarray(x),
        draft_probs=jnp.asarray(q),
        target_probs=jnp.asarray(p),
        accept_uniforms=jnp.asarray(u),
        sample_uniforms=jnp.asarray(s),
    )


def _with(**changes):
    def make():
        inputs = _inputs()
        for name, change in changes.items():
            inputs[name] = change(inputs[name])
        return inputs

    return make


BAD_INPUTS = [
    (
        "tokens rank 1",
        _with(draft_tokens=lambda a: a[0]),
        ValueError,
        "`draft_tokens` must have rank 2, shape (B, G); got shape (4)",
    ),
    (
        "draft_probs rank 2",
        _with(draft_probs=lambda a: a[:, :, 0]),
        ValueError,
        "`draft_probs` must have rank 3, shape (B, G, V); got shape (3, 4)",
    ),
    (
        "target_probs rank 4",
        _with(target_probs=lambda a: a[None]),
        ValueError,
        "`target_probs` must have rank 3, shape (B, G+1, V); got shape (1, 3, 5, 10)",
    ),
    (
        "sample_uniforms rank 2",
        _with(sample_uniforms=lambda a: a[:, None]),
        ValueError,
        "`sample_uniforms` must have rank 1, shape (B,); got shape (3, 1)",
    ),
    (
        "target_probs without the bonus row",
        _with(target_probs=lambda a: a[:, :G]),
        ValueError,
        "`target_probs` must have shape (B, G+1, V) = (3, 5, 10)",
    ),
    (
        "draft_probs vocabulary",
        _with(draft_probs=lambda a: a[:, :, :7]),
        ValueError,
        "`draft_probs` must have shape (B, G, V) = (3, 4, 10)",
    ),
    (
        "draft_probs batch",
        _with(draft_probs=lambda a: a[:2]),
        ValueError,
        "got (2, 4, 10)",
    ),
    (
        "accept_uniforms length",
        _with(accept_uniforms=lambda a: a[:, : G - 1]),
        ValueError,
        "`accept_uniforms` must have shape (B, G) = (3, 4)",
    ),
    (
        "sample_uniforms batch",
        _with(sample_uniforms=lambda a: a[:1]),
        ValueError,
        "`sample_uniforms` must have shape (B,) = (3,)",
    ),
    (
        "float token ids",
        _with(draft_tokens=lambda a: a.astype(jnp.float32)),
        TypeError,
        "`draft_tokens` must have an integer dtype (token ids), got float32",
    ),
    (
        "integer probabilities",
        _with(target_probs=lambda a: a.astype(jnp.int32)),
        TypeError,
        "`target_probs` must have a floating dtype",
    ),
    (
        "boolean uniforms",
        _with(accept_uniforms=lambda a: a > 0.5),
        TypeError,
        "`accept_uniforms` must have a floating dtype",
    ),
    (
        "no draft tokens",
        _with(
            draft_tokens=lambda a: a[:, :0],
            draft_probs=lambda a: a[:, :0],
            target_probs=lambda a: a[:, :1],
            accept_uniforms=lambda a: a[:, :0],
        ),
        ValueError,
        "`draft_tokens` must hold at least one draft token per row",
    ),
]


@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit, eqx.filter_jit])
@pytest.mark.parametrize(
    "make, error, message", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_fails_at_trace_time(make, error, message, wrap):
    with pytest.raises(error, match=re.escape(message)):
        wrap(eqx_specdec.speculative_accept)(**make())


def test_verifier_argument_must_be_a_verifier():
    with pytest.raises(TypeError, match="`verifier` must be an eqx_specdec.Verifier"):
        eqx_specdec.speculative_accept(**_inputs(), verifier=eqx_specdec.RatioTest())


def test_verifier_stage_of_the_wrong_kind():
    with pytest.raises(
        TypeError, match=re.escape("Verifier(`prefix_counter`=...) must be")
    ):
        eqx_specdec.Verifier(prefix_counter=eqx_specdec.RatioTest())


@pytest.mark.parametrize(
    "stage, args, argument",
    [
        (
            eqx_specdec.RatioTest(),
            lambda i: (
                i["draft_tokens"][0],
                i["draft_probs"][0],
                i["target_probs"][0, :G],
                i["accept_uniforms"][0],
            ),
            "target_probs",
        ),
        (
            eqx_specdec.RatioTest(),
            lambda i: (
                i["draft_tokens"][0],
                i["draft_probs"][0],
                i["target_probs"][0],
                i["accept_uniforms"][0, :2],
            ),
            "accept_uniforms",
        ),
        (eqx_specdec.PrefixCounter(), lambda i: (i["accept_uniforms"][0],), "passed"),
        (
            eqx_specdec.TokenAssembler(),
            lambda i: (jnp.int32(1), i["draft_tokens"], jnp.int32(0)),
            "draft_tokens",
        ),
    ],
)
def test_stage_shapes_are_checked_at_trace_time(stage, args, argument):
    with pytest.raises(jaxtyping.TypeCheckError, match=f"parameter '{argument}'"):
        jax.jit(stage)(*args(_inputs()))


class _WrongShapeCounter(eqx_specdec.AbstractPrefixCounter):
    def __call__(self, passed):
        return jnp.cumprod(passed.astype(jnp.int32))


class _WrongRecordRatioTest(eqx_specdec.AbstractRatioTest):
    def __call__(self, draft_tokens, draft_probs, target_probs, accept_uniforms):
        return accept_uniforms < 0.5


@pytest.mark.parametrize(
    "verifier, message",
    [
        (
            eqx_specdec.Verifier(prefix_counter=_WrongShapeCounter()),
            "_WrongShapeCounter returned int32[4] as num_accepted, but "
            "AbstractPrefixCounter.__call__ must return an integer array of shape ()",
        ),
        (
            eqx_specdec.Verifier(ratio_test=_WrongRecordRatioTest()),
            "_WrongRecordRatioTest returned bool[4], but AbstractRatioTest.__call__ must "
            "return an eqx_specdec.Verdict",
        ),
    ],
)
def test_faulty_user_stage_is_named(verifier, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        eqx_specdec.speculative_accept(**_inputs(), verifier=verifier)
