"""Wrong ranks, shapes and dtypes fail at trace time with messages naming the argument."""

import functools
import re
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from helpers import direct, PATH_ERRORS, random_case, tree_accept

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
        "draft_tokens",
    ),
    (
        "draft_probs rank 2",
        _with(draft_probs=lambda a: a[:, :, 0]),
        ValueError,
        "draft_probs",
    ),
    (
        "target_probs rank 4",
        _with(target_probs=lambda a: a[None]),
        ValueError,
        "target_probs",
    ),
    (
        "sample_uniforms rank 2",
        _with(sample_uniforms=lambda a: a[:, None]),
        ValueError,
        "sample_uniforms",
    ),
    (
        "target_probs without the bonus row",
        _with(target_probs=lambda a: a[:, :G]),
        ValueError,
        "target_probs",
    ),
    (
        "draft_probs vocabulary",
        _with(draft_probs=lambda a: a[:, :, :7]),
        ValueError,
        "draft_probs",
    ),
    (
        "draft_probs batch",
        _with(draft_probs=lambda a: a[:2]),
        ValueError,
        "draft_probs",
    ),
    (
        "accept_uniforms length",
        _with(accept_uniforms=lambda a: a[:, : G - 1]),
        ValueError,
        "accept_uniforms",
    ),
    (
        "sample_uniforms batch",
        _with(sample_uniforms=lambda a: a[:1]),
        ValueError,
        "sample_uniforms",
    ),
    (
        "float token ids",
        _with(draft_tokens=lambda a: a.astype(jnp.float32)),
        TypeError,
        "draft_tokens",
    ),
    (
        "integer probabilities",
        _with(target_probs=lambda a: a.astype(jnp.int32)),
        TypeError,
        "target_probs",
    ),
    (
        "boolean uniforms",
        _with(accept_uniforms=lambda a: a > 0.5),
        TypeError,
        "accept_uniforms",
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
        "draft_tokens",
    ),
]


_direct = direct


@pytest.mark.parametrize("wrap", [_direct, jax.jit, eqx.filter_jit])
@pytest.mark.parametrize(
    "make, error, argument", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_fails_at_trace_time(make, error, argument, wrap):
    """Shapes and dtypes are refused while tracing, on every path, by an error whose
    first line names the argument."""
    with pytest.raises(error, match=f"^`{argument}`"):
        wrap(eqx_specdec.speculative_accept)(**make())


def test_verifier_argument_must_be_a_verifier():
    with pytest.raises(TypeError, match="`verifier` must be an eqx_specdec.Abstract"):
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
    counts: ClassVar[str] = "first failure"

    def __call__(self, passed):
        return jnp.cumprod(passed.astype(jnp.int32))


class _WrongRecordRatioTest(eqx_specdec.AbstractRatioTest):
    exact: ClassVar[bool] = True

    def __call__(
        self, draft_tokens, draft_probs, target_probs, accept_uniforms, context
    ):
        return accept_uniforms < 0.5


@pytest.mark.parametrize(
    "verifier, stage",
    [
        (eqx_specdec.Verifier(prefix_counter=_WrongShapeCounter()), _WrongShapeCounter),
        (
            eqx_specdec.Verifier(ratio_test=_WrongRecordRatioTest()),
            _WrongRecordRatioTest,
        ),
    ],
)
def test_faulty_user_stage_is_named(verifier, stage):
    """A user's stage that returns the wrong type or shape is named, on the first
    line."""
    with pytest.raises(TypeError, match=f"^{stage.__name__} returned "):
        eqx_specdec.speculative_accept(**_inputs(), verifier=verifier)


def _set(name, index, value):
    def change(a):
        return a.at[index].set(value)

    return _with(**{name: change})


RUNTIME_BAD_INPUTS = [
    ("NaN draft prob", _set("draft_probs", (2, 1, 3), jnp.nan),
     "draft_probs", 2),
    ("inf target prob", _set("target_probs", (1, 4, 0), jnp.inf),
     "target_probs", 1),
    ("negative draft prob", _set("draft_probs", (0, 0, 0), -0.01),
     "draft_probs", 0),
    ("negative target prob", _set("target_probs", (2, 0, 5), -1e-6),
     "target_probs", 2),
    ("token id V", _set("draft_tokens", (1, 3), V),
     "draft_tokens", 1),
    ("token id -1", _set("draft_tokens", (2, 0), -1),
     "draft_tokens", 2),
    ("accept uniform 1", _set("accept_uniforms", (1, 2), 1.0),
     "accept_uniforms", 1),
    ("accept uniform negative", _set("accept_uniforms", (0, 0), -0.5),
     "accept_uniforms", 0),
    ("NaN sample uniform", _set("sample_uniforms", 2, jnp.nan),
     "sample_uniforms", 2),
    ("draft sum 1.1", _with(draft_probs=lambda a: a.at[1, 2].multiply(1.1)),
     "draft_probs", 1),
    ("unnormalised target", _with(target_probs=lambda a: a.at[0].multiply(3.0)),
     "target_probs", 0),
    ("bfloat16 target sum 0.95", _with(
        target_probs=lambda a: a.at[2, 0].multiply(0.95).astype(jnp.bfloat16)),
     "target_probs", 2),
    ("first offending row", _with(
        accept_uniforms=lambda a: a.at[1, 0].set(2.0).at[2, 0].set(2.0)),
     "accept_uniforms", 1),
]  # fmt: skip


@pytest.mark.parametrize("wrap", [_direct, jax.jit, eqx.filter_jit])
@pytest.mark.parametrize(
    "make, argument, row",
    [b[1:] for b in RUNTIME_BAD_INPUTS],
    ids=[b[0] for b in RUNTIME_BAD_INPUTS],
)
def test_bad_values_fail_at_run_time(make, argument, row, wrap):
    """At the complete level every value is checked; the message and the error class
    (a RuntimeError, see PATH_ERRORS) are the same on every path."""
    check = functools.partial(eqx_specdec.speculative_accept, check_inputs="all")
    # The argument, then the first offending row, on one line.
    message = f"`{argument}` [^\\n]* in row {row} "
    with pytest.raises(PATH_ERRORS[wrap], match=message) as info:
        out = wrap(check)(**make())
        jax.block_until_ready(out)
    assert isinstance(info.value, RuntimeError)


# The RESULTS member each run-time bad input is reported as.
RUNTIME_RESULTS = {
    "NaN draft prob": "invalid_probability",
    "inf target prob": "invalid_probability",
    "negative draft prob": "invalid_probability",
    "negative target prob": "invalid_probability",
    "token id V": "token_out_of_range",
    "token id -1": "token_out_of_range",
    "accept uniform 1": "uniform_out_of_range",
    "accept uniform negative": "uniform_out_of_range",
    "NaN sample uniform": "uniform_out_of_range",
    "draft sum 1.1": "not_normalised",
    "unnormalised target": "not_normalised",
    "bfloat16 target sum 0.95": "not_normalised",
    "first offending row": "uniform_out_of_range",
}


def test_each_problem_is_its_results_member_with_its_row():
    """With `throw=False`, every run-time bad input comes back as its RESULTS member
    and its first row, in one compiled program per input dtype (the inputs vmapped
    over the table's cases where their dtypes agree)."""
    assert set(RUNTIME_RESULTS) == {b[0] for b in RUNTIME_BAD_INPUTS}

    def result(arrays):
        tokens, q, p, u, s = arrays
        verification = eqx_specdec.verify(
            eqx_specdec.Probabilities(p),
            eqx_specdec.Draft(tokens, eqx_specdec.Probabilities(q)),
            eqx_specdec.Uniforms(u, s),
            check_inputs="all",
            throw=False,
        )
        # Which member the result is, as booleans (one per member of `members`).
        found = jnp.stack([verification.result == m for m in members])
        return found, verification.failed_row

    order = sorted(set(RUNTIME_RESULTS.values())) + ["successful"]
    members = [getattr(eqx_specdec.RESULTS, m) for m in order]
    names = ("draft_tokens", "draft_probs", "target_probs", "accept_uniforms")
    names += ("sample_uniforms",)
    groups = {}
    for name, make, _, row in RUNTIME_BAD_INPUTS:
        inputs = make()
        arrays = tuple(jnp.asarray(inputs[k]) for k in names)
        key = tuple(a.dtype for a in arrays)
        groups.setdefault(key, []).append((name, arrays, row))
    for cases in groups.values():
        stacked = jax.tree.map(lambda *a: jnp.stack(a), *[c[1] for c in cases])
        found, rows = eqx.filter_jit(jax.vmap(result))(stacked)
        for index, (name, _, row) in enumerate(cases):
            expected = order.index(RUNTIME_RESULTS[name])
            assert np.flatnonzero(np.asarray(found[index])).tolist() == [expected], name
            assert int(rows[index]) == row, name
    # And a valid input is `successful`, its row -1.
    valid = tuple(jnp.asarray(_inputs()[k]) for k in names)
    found, row = eqx.filter_jit(result)(valid)
    assert np.flatnonzero(np.asarray(found)).tolist() == [len(order) - 1]
    assert int(row) == -1


def test_the_sum_tolerance_on_both_sides():
    """Rows within the tolerance of their dtype (1e-3 for float32, 1e-2 for bfloat16)
    are accepted at every check level; a float32 row just past it is refused."""

    def result(target_scale, draft_scale):
        inputs = _inputs()
        draft = (inputs["draft_probs"] * draft_scale).astype(jnp.bfloat16)
        verification = eqx_specdec.verify(
            eqx_specdec.Probabilities(inputs["target_probs"] * target_scale),
            eqx_specdec.Draft(inputs["draft_tokens"], eqx_specdec.Probabilities(draft)),
            eqx_specdec.Uniforms(inputs["accept_uniforms"], inputs["sample_uniforms"]),
            check_inputs="all",
            throw=False,
        )
        return verification.result

    assert bool(result(1 + 5e-4, 1 + 5e-3) == eqx_specdec.RESULTS.successful)
    assert bool(result(1 + 2e-3, 1 + 5e-3) == eqx_specdec.RESULTS.not_normalised)


@pytest.mark.parametrize(
    "make", [b[1] for b in RUNTIME_BAD_INPUTS], ids=[b[0] for b in RUNTIME_BAD_INPUTS]
)
def test_checks_off_still_well_formed(make):
    inputs = make()
    run = jax.jit(eqx_specdec.speculative_accept, static_argnames="check_inputs")
    out = run(**inputs, check_inputs="off")
    assert out["num_accepted"].dtype == out["tokens"].dtype == jnp.int32
    assert out["num_accepted"].shape == (B,) and out["tokens"].shape == (B, G + 1)
    n = np.asarray(out["num_accepted"])
    assert ((n >= 0) & (n <= G)).all()
    tokens = np.asarray(out["tokens"])
    for b in range(B):
        assert ((tokens[b, : n[b] + 1] >= 0) & (tokens[b, : n[b] + 1] < V)).all()
        assert (tokens[b, n[b] + 1 :] == -1).all()


def test_checks_off_adds_no_operation():
    """With `check_inputs="off"` the program is exactly the verifier's own."""
    inputs = _inputs()
    unchecked = jax.make_jaxpr(
        lambda *a: eqx_specdec.speculative_accept(*a, check_inputs="off")
    )(*inputs.values())
    bare = jax.make_jaxpr(eqx_specdec.Verifier())(*inputs.values())
    checked = jax.make_jaxpr(eqx_specdec.speculative_accept)(*inputs.values())

    def ops(jaxpr):
        jaxpr = jaxpr.jaxpr
        # Step inside the entry point's own jit.
        while len(jaxpr.eqns) == 1 and str(jaxpr.eqns[0].primitive) in ("pjit", "jit"):
            jaxpr = jaxpr.eqns[0].params["jaxpr"].jaxpr
        return [str(eqn.primitive) for eqn in jaxpr.eqns]

    assert ops(unchecked) == ops(bare)
    # Checked: a branch on the program's status whose problem side alone holds the
    # host callback: a valid call sends nothing to the host.

    def conds(eqns):
        for eqn in eqns:
            if str(eqn.primitive) == "cond":
                yield sorted(
                    [str(e.primitive) for e in b.jaxpr.eqns]
                    for b in eqn.params["branches"]
                )
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                yield from conds(sub.eqns)

    (branches,) = conds(checked.jaxpr.eqns)
    assert branches[0] == [] and "debug_callback" in branches[1]


def test_a_callers_jit_sends_nothing_to_the_host_on_a_valid_call(monkeypatch):
    """The check is a branch of the program taken only on a problem: a valid call
    (direct, or inside a caller's `jax.jit`, chain or tree) calls no host callback
    (counted); an invalid one raises the same message when its outputs are read."""
    reads = []
    raise_ = eqx_specdec._inputs.results._raise

    def counted(*args):
        reads.append(1)
        return raise_(*args)

    monkeypatch.setattr(eqx_specdec._inputs.results, "_raise", counted)
    x, q, p, u, s = (jnp.asarray(a) for a in random_case(7, 11, G, V))  # new shapes
    parents = jnp.tile(jnp.arange(-1, G - 1, dtype=jnp.int32), (11, 1))
    tree = (x, parents, jnp.concatenate([q, q[:, :1]], 1), p, u, s)
    jax.block_until_ready(eqx_specdec.speculative_accept(x, q, p, u, s))
    out = jax.jit(eqx_specdec.speculative_accept)(x[:9], q[:9], p[:9], u[:9], s[:9])
    jax.block_until_ready(out)
    jax.block_until_ready(jax.jit(tree_accept)(*(a[:9] for a in tree)))
    assert reads == []  # no callback on valid calls
    bad = p[:9].at[3, 0].set(p[3, 0] * 3)
    message = "`target_probs` has a distribution whose sum is not within"
    run = jax.jit(eqx_specdec.speculative_accept, static_argnames="check_inputs")
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(message)):
        jax.block_until_ready(run(x[:9], q[:9], bad, u[:9], s[:9], check_inputs="all"))
    assert reads == [1]


def test_check_inputs_must_be_static():
    level = '`check_inputs` must be "read"'
    # A string passed to an unmarked jit is JAX's own error, naming the argument.
    with pytest.raises(TypeError, match="path check_inputs"):
        jax.jit(eqx_specdec.speculative_accept)(**_inputs(), check_inputs="off")
    with pytest.raises(TypeError, match=f"{level} .* traced value"):
        jax.jit(lambda c: eqx_specdec.speculative_accept(**_inputs(), check_inputs=c))(
            jnp.int32(0)
        )
    with pytest.raises(TypeError, match=f"{level} .* got 'some'"):
        eqx_specdec.speculative_accept(**_inputs(), check_inputs="some")
    # The booleans of earlier versions name the string that replaces them.
    for old, new in ((False, '"off"'), (True, '"read"')):
        with pytest.raises(TypeError, match=f"got {old}.*`check_inputs={new}`"):
            eqx_specdec.speculative_accept(**_inputs(), check_inputs=old)


def test_verifier_row_checks_its_shapes():
    """`Verifier.row`'s own jaxtyping check stays on (the class is exempt from the test
    suite's import hook only for its constructor's hand-written checks)."""
    with pytest.raises(jaxtyping.TypeCheckError, match="Verifier.row"):
        eqx_specdec.Verifier().row(
            jnp.zeros(3, jnp.int32),
            jnp.full((3, 5), 0.2),
            jnp.full((3, 5), 0.2),  # one row short: (gamma + 1, vocab) expected
            jnp.zeros(3),
            jnp.float32(0.5),
        )


def _flat_row():
    q, p, _ = eqx_specdec.evaluation.synthetic_distributions("flat", 2, 5, 0)
    return q, p


INVALID_EVALUATIONS = {
    "evaluate_verifier, log q": (
        lambda q, p: eqx_specdec.evaluation.evaluate_verifier(
            eqx_specdec.Verifier(), np.log(q), p
        ),
        "evaluate_verifier: `draft_probs` holds a negative value",
    ),
    "quadrature, p * 3": (
        lambda q, p: eqx_specdec.evaluation.emission_by_quadrature(
            eqx_specdec.Verifier(), q, p * 3
        ),
        "`target_probs` has a row summing to 3",
    ),
    "monte carlo, NaN": (
        lambda q, p: eqx_specdec.evaluation.emission_by_monte_carlo(
            eqx_specdec.Verifier(),
            q,
            np.where(np.arange(p.size).reshape(p.shape) == 0, np.nan, p),
            jax.random.key(0),
            10,
        ),
        "`target_probs` holds a NaN",
    ),
    "tree, log p": (
        lambda q, p: eqx_specdec.evaluation.evaluate_verifier(
            eqx_specdec.TreeVerifier(tree=(-1, 0)), np.vstack([q, q[:1]]), np.log(p)
        ),
        "`target_probs` holds a negative value",
    ),
    "objective, log q": (
        lambda q, p: eqx_specdec.evaluation.expected_accepted_length(
            jnp.log(jnp.asarray(q))[None], jnp.asarray(p)[None]
        ),
        "expected_accepted_length: `draft_probs` holds a negative value.*"
        r"eqx_specdec.Logits\(logits, warp\)",
    ),
    "objective, p * 3": (
        lambda q, p: eqx_specdec.evaluation.acceptance_by_position(
            jnp.asarray(q)[None], 3 * jnp.asarray(p)[None]
        ),
        "acceptance_by_position: `target_probs` has a row summing to 3",
    ),
}


@pytest.mark.parametrize("case", INVALID_EVALUATIONS)
def test_evaluation_tools_refuse_invalid_distributions(case):
    """An evaluation of invalid distributions would be a wrong number (a distance of
    0.614, 546864.5 tokens accepted): refused eagerly, naming the argument."""
    call, message = INVALID_EVALUATIONS[case]
    with pytest.raises(ValueError, match=message):
        call(*_flat_row())


def test_the_objectives_take_traced_distributions_unchecked():
    q, p = (jnp.asarray(a)[None] for a in _flat_row())
    eager = eqx_specdec.evaluation.expected_accepted_length(q, p)
    traced = jax.jit(eqx_specdec.evaluation.expected_accepted_length)(q, p)
    np.testing.assert_allclose(traced, eager, rtol=1e-6)
