"""Property-based fuzzing of the public entry points, with Hypothesis (it shrinks a
failing case to its smallest form, which random tables of cases do not).

Each case draws a shape (B, G and V from 1), a float dtype (float16, bfloat16, float32,
and float64 in 64-bit mode), valid inputs, and then corruptions: NaN, infinities,
negative entries, unnormalised and all-zero rows, token ids -1 and past V, uniforms
outside [0, 1), masks with an empty position, degenerate warps (temperature 0, huge,
subnormal; top-k 0, 1, V and past it; top-p tiny and 1; min-p 0 and 1), empty and full
histories with penalties, and stop tokens. Every call either raises the documented
error, whose first line names an argument that really holds a problem, or returns the
documented outputs: equal to the NumPy reference (`helpers.reference`, written from the
contract) on valid inputs, well-formed on invalid ones with the checks off, and never a
token drawn from a row that is not a distribution.

CI runs a bounded, derandomised number of examples over a small pool of shapes (every new
shape or dtype is a new program to compile). A longer run draws shapes freely:

    SPECDEC_FUZZ=long python -m pytest tests/test_fuzz.py -n 2
"""

import dataclasses
import functools
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    accept_from_key,
    accept_logits,
    message_line,
    random_case,
    reference,
    tree_accept,
)
from hypothesis import (
    event,
    given as hypothesis_given,
    HealthCheck,
    settings,
    strategies as st,
)

import eqx_specdec as es


LONG = os.environ.get("SPECDEC_FUZZ") == "long"
if LONG:
    # Thousands of one-off programs: not worth writing to the persistent cache (and
    # JAX 0.10.2's cache writer crashed with a segmentation fault in such a run here).
    jax.config.update("jax_enable_compilation_cache", False)


def given(*strategies, examples):
    """Hypothesis's `given`, with `examples` cases in CI (derandomised: the same cases
    every run) and fifty times as many in the long run."""
    fuzz = settings(
        max_examples=examples * 50 if LONG else examples,
        derandomize=not LONG,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )

    def decorate(test):
        if LONG:
            test = _clearing_caches(test)
        return fuzz(hypothesis_given(*strategies)(test))

    return decorate


def _clearing_caches(test):
    """The long run compiles thousands of programs per worker: JAX's caches are cleared
    every hundred cases, which keeps the workers' memory bounded (with it growing, XLA's
    compiler crashed with a segmentation fault after some hundreds of cases here)."""
    calls = [0]

    @functools.wraps(test)
    def cleared(*args, **kwargs):
        calls[0] += 1
        if calls[0] % 100 == 0:
            jax.clear_caches()
        return test(*args, **kwargs)

    return cleared


def _dtypes():
    dtypes = [np.float16, jnp.bfloat16, np.float32]
    if jax.config.jax_enable_x64:
        dtypes.append(np.float64)
    return dtypes


def _shapes(pool):
    if LONG:
        return st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 40))
    return st.sampled_from(pool)


def _half(dtype) -> bool:
    return np.dtype(dtype).itemsize == 2


def _tolerance(dtype) -> float:
    return 1e-2 if _half(dtype) else 1e-3


def _is_distribution(row, dtype) -> bool:
    row = np.asarray(row, np.float64)
    return bool(
        np.all(np.isfinite(row))
        and np.all(row >= 0)
        and abs(row.sum() - 1) <= _tolerance(dtype)
    )


def _is_uniform(u) -> bool:
    u = np.asarray(u, np.float64)
    return bool(np.all((u >= 0) & (u < 1)))


def _first_line_names(error, arguments):
    """The error's message starts with one of `arguments`, in backticks."""
    if isinstance(error, RuntimeError):  # a run-time check's
        first = message_line(error)
    else:  # a message, or an error raised before tracing
        first = str(error).strip().splitlines()[0]
    named = [a for a in arguments if first.startswith(f"`{a}`")]
    assert named, f"{first!r} names none of {sorted(arguments)}"


# Corruptions of one array entry or row.
VALUES = {
    "nan": np.nan,
    "inf": np.inf,
    "-inf": -np.inf,
    "negative": -0.25,
    "above one": 1.5,
}


@dataclasses.dataclass
class Case:
    x: np.ndarray
    q: np.ndarray | None
    p: np.ndarray
    u: np.ndarray
    s: np.ndarray
    dtype: object

    def arrays(self):
        q = None if self.q is None else jnp.asarray(self.q)
        return (
            jnp.asarray(self.x),
            q,
            jnp.asarray(self.p),
            jnp.asarray(self.u),
            jnp.asarray(self.s),
        )

    def as_float64(self):
        q = None if self.q is None else self.q.astype(np.float64)
        f64 = np.float64
        return self.x, q, self.p.astype(f64), self.u.astype(f64), self.s.astype(f64)


def _corrupt(draw, array, dtype, kinds):
    """Corrupts one entry, or scales, zeroes or masks one row, of a `(B, R, V)`
    array."""
    batch, rows, vocab = array.shape
    b = draw(st.integers(0, batch - 1))
    r = draw(st.integers(0, rows - 1))
    kind = draw(st.sampled_from(kinds))
    if kind == "zero row":
        array[b, r] = 0
    elif kind == "all -inf":
        array[b, r] = -np.inf
    elif kind == "scaled row":
        array[b, r] = (array[b, r].astype(np.float64) * 1.5).astype(dtype)
    else:
        array[b, r, draw(st.integers(0, vocab - 1))] = VALUES[kind]


def _how_many(most):
    """How many corruptions: none in about half the cases."""
    return st.sampled_from([0] * most + list(range(most + 1)))


@st.composite
def chain_cases(draw, pool, corruptions=2):
    batch, gamma, vocab = draw(_shapes(pool))
    dtype = draw(st.sampled_from(_dtypes()))
    x, q, p, u, s = random_case(draw(st.integers(0, 2**16)), batch, gamma, vocab)
    # Rounded to the dtype: the reference reads what the library reads.
    q, p, u, s = (a.astype(dtype) for a in (q, p, u, s))
    if draw(st.integers(0, 3)) == 0:
        q = None  # one-hot drafts
    kinds = [*VALUES, "zero row", "scaled row"]
    for _ in range(draw(_how_many(corruptions))):
        where = draw(st.sampled_from(["p", "q", "x", "u", "s"]))
        if where == "p" or (where == "q" and q is not None):
            _corrupt(draw, p if where == "p" else q, dtype, kinds)
        elif where == "x":
            b, i = draw(st.integers(0, batch - 1)), draw(st.integers(0, gamma - 1))
            x[b, i] = draw(st.sampled_from([-1, vocab, vocab + 7, 2**31 - 1]))
        elif where in ("u", "s"):
            array = u if where == "u" else s
            value = draw(st.sampled_from([np.nan, 1.0, -0.25, np.inf]))
            array.reshape(batch, -1)[draw(st.integers(0, batch - 1)), 0] = value
    return Case(x, q, p, u, s, dtype)


def _chain_problems(case: Case, level: str):
    """The arguments holding an invalid value that `level` reads (see the Correctness
    page), and whether float32 rounding could change which values are read."""
    x, q, p, u, s = case.as_float64()
    batch, gamma = x.shape
    vocab = p.shape[-1]
    bad = set()
    if np.any((x < 0) | (x >= vocab)):
        bad.add("draft_tokens")
    if not _is_uniform(u):
        bad.add("accept_uniforms")
    if not _is_uniform(s):
        bad.add("sample_uniforms")
    rows = {"target_probs": p, "draft_probs": q}
    if level == "all":
        for name, array in rows.items():
            if array is not None and not all(
                _is_distribution(row, case.dtype) for row in array.reshape(-1, vocab)
            ):
                bad.add(name)
        return bad, False
    if bad:
        return bad, False
    # The default level: the draft tokens' entries at every position, then rows n.
    for name, array in rows.items():
        if array is None:
            continue
        entries = np.take_along_axis(array[:, :gamma], x[..., None], -1)
        if not np.all(np.isfinite(entries) & (entries >= 0) & (entries <= 1)):
            bad.add(name)
    if bad:
        return bad, False
    n, _, ambiguous = reference(x, q, p, u, s)
    for b in range(batch):
        if not _is_distribution(p[b, n[b]], case.dtype):
            bad.add("target_probs")
        if q is not None and n[b] < gamma:
            if not _is_distribution(q[b, n[b]], case.dtype):
                bad.add("draft_probs")
    return bad, bool(np.any(ambiguous))


def _assert_well_formed(out, batch, gamma, vocab):
    n, tokens = np.asarray(out["num_accepted"]), np.asarray(out["tokens"])
    assert out["num_accepted"].dtype == out["tokens"].dtype == jnp.int32
    assert n.shape == (batch,) and tokens.shape == (batch, gamma + 1)
    assert np.all((n >= 0) & (n <= gamma))
    for b in range(batch):
        assert np.all(tokens[b, n[b] + 1 :] == -1)
        assert -1 <= tokens[b, n[b]] < vocab
    return n, tokens


def _assert_reference(out, case: Case):
    x, q, p, u, s = case.as_float64()
    n, tokens, ambiguous = reference(x, q, p, u, s)
    clear = ~ambiguous
    np.testing.assert_array_equal(np.asarray(out["num_accepted"])[clear], n[clear])
    np.testing.assert_array_equal(np.asarray(out["tokens"])[clear], tokens[clear])


def _never_from_a_broken_row(n, tokens, case: Case):
    """With the checks off: a correction drawn from a row holding a NaN or an infinity
    is -1."""
    x, q, p, _, _ = case.as_float64()
    gamma = x.shape[1]
    for b, n_b in enumerate(n):
        rows = [p[b, n_b]] + ([q[b, n_b]] if q is not None and n_b < gamma else [])
        if not all(np.all(np.isfinite(r)) for r in rows):
            assert tokens[b, n_b] == -1, (b, n_b, tokens[b])


CHAIN_ARGUMENTS = {
    "draft_tokens",
    "draft_probs",
    "target_probs",
    "accept_uniforms",
    "sample_uniforms",
}


@given(chain_cases([(1, 1, 1), (2, 3, 5), (3, 2, 32)]), examples=14)
def test_speculative_accept_at_every_check_level(case):
    """The default level raises exactly when a value it reads is invalid, `"all"` when
    any value is (here through `verify(throw=False)`'s result code and message), and
    `"off"` never raises; valid inputs give the reference's tokens at every level."""
    arrays = case.arrays()
    batch, gamma = case.x.shape
    vocab = case.p.shape[-1]

    out = es.speculative_accept(*arrays, check_inputs="off")
    n, tokens = _assert_well_formed(out, batch, gamma, vocab)
    _never_from_a_broken_row(n, tokens, case)

    # Raised exactly when a value read is invalid; the first line names an argument
    # holding an invalid value (the first problem the checks meet, in their order).
    bad, uncertain = _chain_problems(case, "read")
    bad_all, _ = _chain_problems(case, "all")
    try:
        out = es.speculative_accept(*arrays)
    except RuntimeError as error:
        assert bad or uncertain, error
        _first_line_names(error, bad_all)
    else:
        assert not bad or uncertain, bad
        _assert_reference(out, case)

    tokens, q, p, u, s = arrays
    draft = es.Draft(tokens, None if q is None else es.Probabilities(q))
    verification = es.verify(
        es.Probabilities(p),
        draft,
        es.Uniforms(u, s),
        check_inputs="all",
        throw=False,
    )
    event("refused by the complete level" if bad_all else "the reference's tokens")
    if bad_all:
        assert not bool(verification.result == es.RESULTS.successful)
        _first_line_names(verification.error_message(), bad_all)
    else:
        assert bool(verification.result == es.RESULTS.successful)
        _assert_reference(verification.as_dict(), case)
        _assert_reference(es.speculative_accept(*arrays, check_inputs="off"), case)


@given(chain_cases([(1, 2, 3), (2, 2, 6)], corruptions=1), examples=8)
def test_tree_accept_on_a_chain_and_from_a_key(case):
    """A chain written as a tree (with a padding node) gives the reference's tokens
    (`tree_accept` checks every row at both levels, and never emits from a broken row
    with the checks off); `speculative_accept_from_key` equals `speculative_accept` on
    the key's uniforms."""
    arrays = case.arrays()
    x, q, p, u, s = arrays
    batch, gamma = case.x.shape
    vocab = case.p.shape[-1]
    # One padding node (parent -2) after the chain: never visited, never read.
    parents = jnp.asarray(np.tile(np.r_[np.arange(-1, gamma - 1), -2], (batch, 1)))
    nodes = jnp.concatenate([x, jnp.zeros((batch, 1), x.dtype)], 1)
    pad = jnp.full((batch, 2, vocab), 1 / vocab, p.dtype)  # rows never read
    tree_p = jnp.concatenate([p, pad[:, :1]], 1)
    tree_q = None if q is None else jnp.concatenate([q, pad], 1)
    tree_u = jnp.concatenate([u, jnp.zeros((batch, 1), u.dtype)], 1)
    tree_inputs = (nodes, parents, tree_q, tree_p, tree_u, s)

    # One-hot drafts are deterministic candidates (the rule for a single child).
    rule = es.IIDCandidates() if q is not None else es.DeterministicCandidates()
    run_tree = functools.partial(tree_accept, verifier=es.TreeVerifier(node_rule=rule))
    out = run_tree(*tree_inputs, check_inputs="off")
    n, tokens = np.asarray(out["num_accepted"]), np.asarray(out["tokens"])
    assert tokens.shape == (batch, gamma + 2) and np.all((n >= 0) & (n <= gamma))
    _never_from_a_broken_row(n, tokens[:, : gamma + 1], case)

    bad, _ = _chain_problems(case, "all")
    try:
        out = run_tree(*tree_inputs)
    except RuntimeError as error:
        renamed = {"draft_tokens": "node_tokens"}
        _first_line_names(error, {renamed.get(a, a) for a in bad})
    else:
        assert not bad, bad
        chain = {"num_accepted": out["num_accepted"], "tokens": out["tokens"][:, :-1]}
        _assert_reference(chain, case)
        assert np.all(np.asarray(out["tokens"])[:, -1] == -1)

    key = jax.random.key(int(case.x.sum()) % 1000)
    try:
        from_key = accept_from_key(key, x, q, p)
    except RuntimeError as error:
        key_bad, _ = _chain_problems(case, "read")
        _first_line_names(
            error, key_bad - {"accept_uniforms", "sample_uniforms"} or CHAIN_ARGUMENTS
        )
        return
    drawn = es.Uniforms.from_key(key, batch, gamma)
    accept, sample = drawn.accept, drawn.sample
    with_uniforms = es.speculative_accept(x, q, p, accept, sample, check_inputs="off")
    for name in ("num_accepted", "tokens"):
        np.testing.assert_array_equal(from_key[name], with_uniforms[name])


# The logits entry point: warps, masks, penalties with histories.

PENALTIES = dict(repetition_penalty=1.6, frequency_penalty=0.5, presence_penalty=0.3)
TEMPERATURES = [0.0, 0.7, 1.0, 1e4]
TOP_K = [None, 0, 1, 2, "V", "V + 3"]
TOP_P = [None, 1e-6, 0.5, 1.0]
MIN_P = [None, 0.0, 0.3, 1.0]
# Values `Warp` refuses, each naming its parameter.
OUT_OF_RANGE = {
    "temperature": [-1.0, np.nan, np.inf, 1e-39],
    "top_k": [-1],
    "top_p": [0.0, 1.5],
    "min_p": [1.5],
}


@st.composite
def warps(draw, batch, vocab):
    """A `Warp` (scalars or per-row arrays) and its parameters per row, or the name of
    the parameter given a value out of its range."""
    per_row = draw(st.booleans())
    choices = {
        "temperature": TEMPERATURES,
        "top_k": TOP_K,
        "top_p": TOP_P,
        "min_p": MIN_P,
    }
    values = {}
    for name, options in choices.items():
        rows = [draw(st.sampled_from(options)) for _ in range(batch if per_row else 1)]
        rows = [vocab if r == "V" else vocab + 3 if r == "V + 3" else r for r in rows]
        if None in rows:
            rows = [None] * len(rows)
        values[name] = rows
    refused = None
    if draw(st.integers(0, 7)) == 0:
        refused = draw(st.sampled_from(sorted(OUT_OF_RANGE)))
        values[refused] = [draw(st.sampled_from(OUT_OF_RANGE[refused]))] * len(
            values[refused]
        )
    penalties = PENALTIES if draw(st.booleans()) else {}

    def field(name, rows):
        if rows[0] is None:
            return None
        if not per_row:
            return rows[0]
        return jnp.asarray(rows, jnp.int32 if name == "top_k" else jnp.float32)

    fields = {name: field(name, rows) for name, rows in values.items()}
    per_batch = {k: [r[b % len(r)] for b in range(batch)] for k, r in values.items()}
    try:
        warp = es.Warp(**fields, **penalties)
    except ValueError as error:
        return None, per_batch, penalties, (refused, error)
    # Only a per-row subnormal temperature can pass: XLA CPU flushes it to 0 when the
    # array is made, which is greedy (as the reference's `temperature < tiny` is).
    assert refused is None or refused == "temperature" and per_row, refused
    return warp, per_batch, penalties, None


def _numpy_warp(logits, params, counts, penalties):
    """One row's positions `(R, V)` warped as the Warp docstring says, in the library's
    compute dtype up to the softmax and float64 after it: `(log-probabilities,
    ambiguous)`, where `ambiguous` marks a cut-off within rounding of a value."""
    compute = np.float64 if logits.dtype == np.float64 else np.float32
    x = logits.astype(compute)
    if penalties:
        seen = counts > 0
        r = compute(penalties["repetition_penalty"])
        x = np.where(seen, np.where(x > 0, x / r, x * r), x)
        x = x - compute(penalties["frequency_penalty"]) * counts.astype(compute)
        x = x - compute(penalties["presence_penalty"]) * seen.astype(compute)
    temperature = params["temperature"]
    ambiguous = False
    if temperature == 0 or temperature < np.finfo(compute).tiny:
        greedy = np.full(x.shape, -np.inf)
        greedy[np.arange(x.shape[0]), np.argmax(x, -1)] = 0.0
        return greedy, False
    z = (x / compute(temperature)).astype(np.float64)
    if params["top_k"]:
        kth = -np.sort(-z, -1)[:, min(params["top_k"], z.shape[-1]) - 1 : None][:, :1]
        z = np.where(z < kth, -np.inf, z)

    def probs_of(z):
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    if params["top_p"] is not None:
        probs = probs_of(z)
        for r in range(z.shape[0]):
            order = np.argsort(-probs[r], kind="stable")
            before = np.cumsum(probs[r, order]) - probs[r, order]
            keep = max(int(np.sum(before < params["top_p"])), 1)
            ambiguous |= bool(np.any(np.abs(before - params["top_p"]) < 1e-4))
            z[r] = np.where(probs[r] < probs[r, order[keep - 1]], -np.inf, z[r])
    if params["min_p"] is not None:
        probs = probs_of(z)
        cut = params["min_p"] * probs.max(-1, keepdims=True)
        ambiguous |= bool(np.any(np.abs(probs - cut) < 1e-4 * cut + 1e-30))
        z = np.where(probs < cut, -np.inf, z)
    log_probs = z - z.max(-1, keepdims=True)
    return log_probs - np.log(np.exp(log_probs).sum(-1, keepdims=True)), ambiguous


@st.composite
def logits_cases(draw, pool):
    batch, gamma, vocab = draw(_shapes(pool))
    dtype = draw(st.sampled_from(_dtypes()))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    scale = draw(st.sampled_from([0.5, 3.0, 30.0]))
    target = rng.normal(size=(batch, gamma + 1, vocab)) * scale
    if draw(st.booleans()):
        target = np.round(target * 2) / 2  # ties
    draft = target[:, :gamma] + rng.normal(size=(batch, gamma, vocab))
    target, draft = target.astype(dtype), draft.astype(dtype)
    if draw(st.integers(0, 3)) == 0:
        draft = None
    x = rng.integers(0, vocab, (batch, gamma)).astype(np.int32)
    u = rng.uniform(size=(batch, gamma)).astype(dtype)
    s = rng.uniform(size=batch).astype(dtype)
    target_warp = draw(warps(batch, vocab))
    plain = {"temperature": [1.0], "top_k": [None], "top_p": [None], "min_p": [None]}
    plain = {k: v * batch for k, v in plain.items()}
    draft_warp = target_warp if draw(st.booleans()) else (es.Warp(), plain, {}, None)
    history = None
    if target_warp[2] or draft_warp[2]:
        length = draw(st.sampled_from([0, 3]))
        history = rng.integers(-1, vocab, (batch, length)).astype(np.int32)
        if length and draw(st.integers(0, 5)) == 0:
            history[0, -1] = vocab  # out of range
    allowed = None
    if draw(st.integers(0, 2)) == 0:  # masks; an empty position in one of twelve cases
        allowed = rng.uniform(size=(batch, gamma + 1, vocab)) < 0.7
        allowed[..., 0] |= ~allowed.any(-1)
        if draw(st.integers(0, 3)) == 0:
            allowed[draw(st.integers(0, batch - 1)), draw(st.integers(0, gamma))] = (
                False
            )
    for _ in range(draw(_how_many(2))):
        where = draw(st.sampled_from(["target", "draft", "x", "u"]))
        array = {"target": target, "draft": draft}.get(where)
        if array is not None:
            _corrupt(draw, array, dtype, ["nan", "inf", "-inf", "all -inf"])
        elif where == "x":
            x[draw(st.integers(0, batch - 1)), 0] = draw(st.sampled_from([-1, vocab]))
        elif where == "u":
            u[draw(st.integers(0, batch - 1)), 0] = draw(st.sampled_from([np.nan, 1.0]))
    return dict(
        x=x,
        draft=draft,
        target=target,
        u=u,
        s=s,
        target_warp=target_warp,
        draft_warp=draft_warp,
        history=history,
        allowed=allowed,
    )


def _counts(history, x, vocab):
    """Each position's token counts `(B, G + 1, V)`: the history's (-1 pads) and the
    draft tokens before the position."""
    batch, gamma = x.shape
    counts = np.zeros((batch, gamma + 1, vocab), np.int64)
    for b in range(batch):
        for i in range(gamma + 1):
            for t in [*(history[b] if history is not None else []), *x[b, :i]]:
                if 0 <= t < vocab:
                    counts[b, i, t] += 1
    return counts


@given(logits_cases([(1, 1, 1), (2, 2, 5), (2, 3, 32)]), examples=16)
def test_speculative_accept_logits_with_warps_masks_and_penalties(case):
    """Every warp parameter out of its range is refused at construction, naming it; a
    call raises exactly when a logit, id, uniform, history entry or mask is invalid,
    naming one that is; otherwise the tokens are the reference's on the warped rows
    (both warps applied as documented, masks first, penalties counting the draft
    prefix), every emitted token's log-probability is finite and equals the warped
    row's, and with the checks off a broken row gives -1."""
    target_warp, target_params, penalties, refused = case["target_warp"]
    draft_warp, draft_params, draft_penalties, draft_refused = case["draft_warp"]
    for problem in (refused, draft_refused):
        if problem is not None:
            name, error = problem
            _first_line_names(error, {name})
            event("a warp parameter refused")
            return
    x, draft, target, u, s = (case[k] for k in ("x", "draft", "target", "u", "s"))
    history, allowed = case["history"], case["allowed"]
    batch, gamma = x.shape
    vocab = target.shape[-1]
    call = functools.partial(
        accept_logits,
        jnp.asarray(x),
        None if draft is None else jnp.asarray(draft),
        jnp.asarray(target),
        jnp.asarray(u),
        jnp.asarray(s),
        target_warp=target_warp,
        draft_warp=draft_warp,
        history=None if history is None else jnp.asarray(history),
        allowed=None if allowed is None else jnp.asarray(allowed),
        logprobs=es.LogProbs(),
    )
    out = call(check_inputs="off")
    _assert_well_formed(out, batch, gamma, vocab)

    bad = set()
    for name, array in (("target_logits", target), ("draft_logits", draft)):
        if array is None:
            continue
        values = array.astype(np.float64)
        if allowed is not None:
            mask = allowed if name == "target_logits" else allowed[:, :gamma]
            values = np.where(mask, values, -np.inf)
        if np.any(
            np.isnan(array.astype(np.float64)) | (array.astype(np.float64) == np.inf)
        ):
            bad.add(name)
        if np.any(np.all(values == -np.inf, -1)):
            bad.add(name)
    if allowed is not None and np.any(~allowed.any(-1)):
        bad.add("allowed")
    if np.any((x < 0) | (x >= vocab)):
        bad.add("draft_tokens")
    if not _is_uniform(u.astype(np.float64)):
        bad.add("accept_uniforms")
    if history is not None and np.any(history >= vocab):
        bad.add("history")
    try:
        checked = call()
    except RuntimeError as error:
        assert bad, error
        _first_line_names(error, bad)
        event("an invalid input refused")
        return
    assert not bad, bad
    event("the reference's tokens")

    counts = _counts(history, x, vocab)
    masked_target = target if allowed is None else np.where(allowed, target, -np.inf)
    p, q, ambiguous = [], [], np.zeros(batch, bool)
    for b in range(batch):
        params = {k: v[b] for k, v in target_params.items()}
        log_p, unclear = _numpy_warp(masked_target[b], params, counts[b], penalties)
        p.append(np.exp(log_p))
        ambiguous[b] |= unclear
        if draft is not None:
            masked = (
                draft[b]
                if allowed is None
                else np.where(allowed[b, :gamma], draft[b], -np.inf)
            )
            params = {k: v[b] for k, v in draft_params.items()}
            log_q, unclear = _numpy_warp(
                masked, params, counts[b, :gamma], draft_penalties
            )
            q.append(np.exp(log_q))
            ambiguous[b] |= unclear
    p = np.stack(p)
    q = np.stack(q) if draft is not None else None
    n, tokens, tie = reference(x, q, p, u.astype(np.float64), s.astype(np.float64))
    clear = ~(ambiguous | tie)
    np.testing.assert_array_equal(np.asarray(checked["num_accepted"])[clear], n[clear])
    np.testing.assert_array_equal(np.asarray(checked["tokens"])[clear], tokens[clear])
    emitted = np.asarray(checked["tokens"])
    logprobs = np.asarray(checked["logprobs"])
    for b in np.flatnonzero(clear):
        for i in range(n[b] + 1):
            assert np.isfinite(logprobs[b, i]), (b, i)
            expected = np.log(p[b, i, emitted[b, i]])
            np.testing.assert_allclose(logprobs[b, i], expected, rtol=1e-3, atol=1e-3)


# The decoding loop: models that return rows that are not distributions, stop tokens.


class _Bigram(eqx.Module):
    """A stateless model: the next-token distribution is a row of `table`, chosen by the
    previous token."""

    table: jax.Array

    def __call__(self, tokens, positions):
        return self.table[tokens[positions]]


DECODE_VOCAB, DECODE_TOKENS, STOP_TOKENS = 6, 7, (0, 4)


@st.composite
def bigram_tables(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    tables = []
    for _ in range(2):  # the draft's, then the target's
        table = rng.dirichlet(np.full(DECODE_VOCAB, 0.5), DECODE_VOCAB)
        table[rng.uniform(size=table.shape) < 0.3] = 0  # sparse rows: zero entries
        table[np.arange(DECODE_VOCAB), rng.integers(0, DECODE_VOCAB, DECODE_VOCAB)] += (
            0.1
        )
        tables.append(table / table.sum(-1, keepdims=True))
    for _ in range(draw(_how_many(1))):
        table = tables[draw(st.integers(0, 1))]
        row = draw(st.integers(0, DECODE_VOCAB - 1))
        kind = draw(
            st.sampled_from(["nan", "inf", "negative", "scaled row", "zero row"])
        )
        if kind == "zero row":
            table[row] = 0
        elif kind == "scaled row":
            table[row] *= 3
        else:
            table[row, draw(st.integers(0, DECODE_VOCAB - 1))] = VALUES[kind]
    prompts = rng.integers(0, DECODE_VOCAB, (3, 2)).astype(np.int32)
    return tables[0].astype(np.float32), tables[1].astype(np.float32), prompts


@given(bigram_tables(), examples=6)
def test_speculative_decode_with_broken_models_and_stop_tokens(tables):
    """Every emitted token has positive probability under the target's row for its
    context, and that row is a distribution; a row stops at its first stop token; a
    row that reaches a model's invalid row finishes with "error" at the position it
    reached, and `check_models=True` raises naming a model whose table is broken."""
    draft_table, target_table, prompts = tables
    draft, target = (
        _Bigram(jnp.asarray(draft_table)),
        _Bigram(jnp.asarray(target_table)),
    )
    decode = functools.partial(
        es.speculative_decode,
        draft,
        target,
        jnp.asarray(prompts),
        None,
        DECODE_TOKENS,
        jax.random.key(int(prompts.sum())),
        stop_tokens=STOP_TOKENS,
    )
    out = decode()
    valid = [np.array([_is_distribution(r, np.float32) for r in t]) for t in tables[:2]]
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    reasons = out.finish_reason_names()
    for b, (length, reason) in enumerate(zip(lengths, reasons)):
        emitted = tokens[b, :length]
        assert np.all(tokens[b, length:] == -1)
        context = np.r_[prompts[b, -1], emitted][:length]  # each token's context
        assert np.all(valid[1][context]), (b, context, emitted)
        assert np.all(target_table[context, emitted] > 0), (b, context, emitted)
        stops = np.isin(emitted, STOP_TOKENS)
        assert not np.any(stops[:-1])
        if reason == "stop":
            assert stops[-1]
        elif reason == "length":
            assert length == DECODE_TOKENS and not stops[-1]
        else:
            # A row a model returned that step was broken (the target's rows at the
            # step's draft tokens are checked too, whether or not they are reached).
            assert not np.all(valid[0]) or not np.all(valid[1])
            assert int(out.error_positions[b]) == length
    if "error" not in reasons:
        event("decoded to the end")
        return
    event("a model's invalid row stopped a row")
    broken = {
        name for name, v in zip(("draft_model", "target_model"), valid) if not v.all()
    }
    with pytest.raises(RuntimeError) as error:
        decode(check_models=True)
    _first_line_names(error.value, broken)
