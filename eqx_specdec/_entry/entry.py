"""The one compiled entry point, [`eqx_specdec.verify`][], over typed inputs, and the
contract's signature over it, [`eqx_specdec.speculative_accept`][]."""

import functools
import inspect
import typing
from types import MappingProxyType

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, Key

from .._chain.abstract_verifier import AbstractVerifier
from .._chain.inputs import is_key
from .._chain.logits import logits_step
from .._chain.verifier import probability_step, Verifier
from .._exactness import refuse_inexact
from .._inputs.checks import check_level, CheckLevel
from .._inputs.logprobs import LogProbs
from .._inputs.results import Problem, raise_if_failed, raise_on_host, status_of
from .._inputs.typed_inputs import Draft, Logits, Probabilities, Uniforms
from .._misc import no_type_check
from .._warps.warp import Warp
from .verification import OPTIONAL_OUTPUTS, Verification


@no_type_check  # its fields are checked where they are read, naming the argument
class StepOptions(eqx.Module):
    """The options of one [`eqx_specdec.verify`][] call besides its inputs, as
    [`eqx_specdec.families.verification_step`][] gets them.

    **Fields:**

    - `logprobs`: `None` or the [`eqx_specdec.LogProbs`][] asked for.
    - `allowed`: `None` or bool `(B, G + 1, V)`, the allowed tokens per position.
    - `draft_allowed`: whether the draft sampled under `allowed`.
    - `history`: `None` or int `(B, H)`, the tokens a warp's penalties count.
    - `check_inputs`: the check level, `"read"`, `"all"` or `"off"`.
    """

    logprobs: LogProbs | None
    allowed: Array | None
    draft_allowed: bool = eqx.field(static=True)
    history: Int[Array, "B H"] | None
    check_inputs: CheckLevel = eqx.field(static=True)


@functools.singledispatch
def verification_step(
    verifier, target, draft, randomness, options: StepOptions
) -> tuple[dict[str, Array], list[Problem]]:
    """One verification step of `verifier`, which [`eqx_specdec.verify`][] calls inside
    its compiled program (so traced, on the typed inputs as the caller gave them).
    Chains and trees register theirs; a family of your own (a verifier class of its
    own) registers with `@verification_step.register` on a function whose first
    argument is annotated with its class.

    **Arguments:**

    - `verifier`: the verifier.
    - `target`: the [`eqx_specdec.Probabilities`][] or [`eqx_specdec.Logits`][] of
        the target.
    - `draft`: the [`eqx_specdec.Draft`][].
    - `randomness`: the [`eqx_specdec.Uniforms`][], or a typed `jax.random` key.
    - `options`: the [`eqx_specdec.families.StepOptions`][].

    **Returns:**

    `(outputs, problems)`: the outputs as a dict (`"num_accepted"` int32 `(B,)`,
    `"tokens"` int32 `(B, G + 1)`, and the fields of `logprobs` when asked), and the
    run-time checks as a list of [`eqx_specdec.families.Problem`][] (empty with
    checks off). `verify` builds the [`eqx_specdec.Verification`][] from them and
    raises the first problem's message, with its first row, when `throw=True`.
    """
    raise TypeError(
        "`verifier` must be an eqx_specdec.AbstractVerifier (Verifier, "
        "ShardedVerifier) or an eqx_specdec.AbstractTreeVerifier (TreeVerifier, "
        f"TraversalVerifier), or a family registered with "
        f"eqx_specdec.families.verification_step; got {type(verifier).__name__}."
    )


def as_key(value):
    """A typed `jax.random` key for a typed key or a legacy one (`jax.random.PRNGKey`,
    uint32 `(2,)`); `None` for anything else."""
    if is_key(value):
        return value
    if (
        hasattr(value, "dtype")
        and jnp.dtype(value.dtype) == jnp.uint32
        and jnp.shape(value) == (2,)
    ):
        return jax.random.wrap_key_data(value)
    return None


def _chain_uniforms(randomness, verifier, tokens):
    if not isinstance(randomness, Uniforms):
        randomness = Uniforms.from_key(
            randomness, *jnp.shape(tokens), verifier=verifier
        )
    return randomness.accept, randomness.sample


@verification_step.register
def _chain_step(
    verifier: AbstractVerifier, target, draft, randomness, options: StepOptions
):
    if draft.parents is not None:
        raise ValueError(
            f"verify: `draft` has `parents`, the shape of a tree, but "
            f"`verifier` ({type(verifier).__name__}) verifies chains. Pass a tree "
            "verifier (TreeVerifier, TraversalVerifier), or `Draft(tokens, "
            "distribution)` without parents."
        )
    accept, sample = _chain_uniforms(randomness, verifier, draft.tokens)
    shared = dict(
        verifier=verifier,
        check_inputs=options.check_inputs,
        logprobs=options.logprobs,
        allowed=options.allowed,
        draft_allowed=options.draft_allowed,
    )
    q = draft.distribution
    if isinstance(target, Probabilities):
        return probability_step(
            draft.tokens,
            None if q is None else q.probs,
            target.probs,
            accept,
            sample,
            **shared,
        )
    return logits_step(
        draft.tokens,
        None if q is None else q.logits,
        target.logits,
        accept,
        sample,
        target_warp=target.warp,
        draft_warp=Warp() if q is None else q.warp,
        history=options.history,
        **shared,
    )


def _check_kinds(target, draft, randomness):
    if not isinstance(target, (Probabilities, Logits)):
        raise TypeError(
            f"verify(`target`=...) must be an eqx_specdec.Probabilities or "
            f"eqx_specdec.Logits; got {type(target).__name__}. Wrap the array: "
            "`Probabilities(target_probs)` or `Logits(target_logits, Warp(...))`."
        )
    if not isinstance(draft, Draft):
        raise TypeError(
            f"verify(`draft`=...) must be an eqx_specdec.Draft; got "
            f"{type(draft).__name__}. Wrap the tokens: `Draft(draft_tokens, "
            "Probabilities(draft_probs))`."
        )
    q = draft.distribution
    if q is not None and type(q) is not type(target):
        raise TypeError(
            f"verify: the target is given as {type(target).__name__} and the draft's "
            f"distribution as {type(q).__name__}; give both the same way (both "
            "Probabilities, or both Logits with their warps)."
        )
    if not (isinstance(randomness, Uniforms) or as_key(randomness) is not None):
        raise TypeError(
            f"verify(`randomness`=...) must be an eqx_specdec.Uniforms or a "
            f"jax.random key (jax.random.key(seed)); got {type(randomness).__name__}."
        )


@eqx.filter_jit
@typing.no_type_check  # validated by hand, with messages naming the argument
def verify(
    target: Probabilities | Logits,
    draft: Draft,
    randomness: Uniforms | Key[Array, ""],
    *,
    verifier=None,
    logprobs: LogProbs | None = None,
    allowed: Array | None = None,
    draft_allowed: bool = True,
    history: Int[Array, "B H"] | None = None,
    check_inputs: CheckLevel = "read",
    throw: bool = True,
    exact_only: bool = False,
) -> Verification:
    """Runs one verification step of speculative decoding on a batch: the library's one
    compiled entry point, for chains and trees, probabilities and logits.

    The inputs say what they are: the target as [`eqx_specdec.Probabilities`][] or
    [`eqx_specdec.Logits`][] (with the [`eqx_specdec.Warp`][] sampled with), the
    draft as a [`eqx_specdec.Draft`][] (its tokens, the law they were drawn from, and
    for a tree its `parents`), the randomness as [`eqx_specdec.Uniforms`][] or a
    `jax.random` key. The verifier says the rule and the proposal's shape: an
    [`eqx_specdec.Verifier`][] (or [`eqx_specdec.ShardedVerifier`][]) verifies chains,
    a tree verifier ([`eqx_specdec.TreeVerifier`][],
    [`eqx_specdec.TraversalVerifier`][]) trees.

    On [`eqx_specdec.Logits`][], both sides are warped to log-probabilities
    ($\\log \\tilde p$ by the target's warp, $\\log \\tilde q$ by the draft's) and
    verified in log space: draft token $x_i$ passes when
    $\\log u_i < \\log \\tilde p_i(x_i) - \\log \\tilde q_i(x_i)$ (logits of $10^4$ do not
    overflow, tiny probabilities do not underflow to a wrong verdict), and the emitted
    tokens follow the warped target exactly, provided the draft tokens were drawn from
    $\\tilde q$. Rows with target temperature 0 are greedy (their $\\tilde p$ is
    one-hot at the argmax); greedy and sampled rows mix in one batch.

    Compiled with `eqx.filter_jit`: every array of the inputs and of the verifier's
    stages is traced, every other value (a stage's Python fields, `check_inputs`,
    `throw`) is static. Works as well inside `eqx.filter_jit`, `jax.jit` and
    `jax.vmap`. The only randomness is `randomness`: the same inputs give
    bit-identical outputs.

    **Arguments:**

    - `target`: the target's distributions $p$, `(B, G + 1, V)` for a chain (row `G`
        follows the last draft token), `(B, N + 1, V)` per context for a tree.
    - `draft`: the [`eqx_specdec.Draft`][].
    - `randomness`: [`eqx_specdec.Uniforms`][] (as the contract has them), or a
        `jax.random` key: for a chain, drawn as [`eqx_specdec.Uniforms.from_key`][]
        says (a row's tokens do not depend on the other rows or the batch size); for a
        tree, row $b$'s uniforms from `fold_in(key, b)`.
    - `verifier`: the rule. Default: the standard rule for chains,
        [`eqx_specdec.Verifier`][]`()` (on logits, its log-space form); a tree needs
        its tree verifier.
    - `logprobs`: `None`, or an [`eqx_specdec.LogProbs`][]: the emitted tokens'
        log-probabilities, in the result's fields.
    - `allowed`, `draft_allowed`: each position's allowed tokens and whether the draft
        sampled under them, as for [`eqx_specdec.speculative_accept`][] (on logits,
        the disallowed logits become $-\\infty$ before the warps).
    - `history`: integer `(B, H)`, each row's tokens that the warps' penalties count
        (the generated tokens, and the prompt's if your convention counts them), -1
        for padding; required when a warp has a penalty (logits only). At draft
        position $i$ (a tree's context) the history is this and the draft tokens
        before it: each position is penalised as its true prefix says.
    - `check_inputs`: the run-time check level, `"read"` (the default), `"all"` or
        `"off"`, as for [`eqx_specdec.speculative_accept`][]. On logits: no NaN or
        $+\\infty$ logit, no distribution with every logit $-\\infty$, warp
        parameters in range; `"read"` checks the rows the verification read (rows 0
        to n where the test reads the draft tokens' values and the counter stops at
        the first failure; every row with a mask or a logit bias), through the
        normalisers the warp found there, and `"all"` every row. For trees both levels
        check every row (the walk reads them all).
    - `throw`: `True` (the default) to raise the first problem found, inside the
        program (see **Raises**); `False` to return it instead, in
        `Verification.result` (an [`eqx_specdec.RESULTS`][] member) and
        `Verification.failed_row`, as Optimistix's `throw=False` does.
    - `exact_only`: `True` to refuse a verifier whose `exact` is False, as for
        [`eqx_specdec.speculative_accept`][].

    **Returns:**

    A [`eqx_specdec.Verification`][].

    **Raises:**

    - `TypeError`, `ValueError`: at trace time, for inputs of the wrong kind, shape or
        dtype, naming the argument.
    - `RuntimeError`: with `throw=True`, for an invalid value or a stage's output
        outside its contract, raised inside the program (when the outputs are read);
        its message names the argument (or the stage's class), the problem, the first
        offending row and the fix. With one device it is Equinox's
        `eqx.EquinoxRuntimeError` (called directly, under `eqx.filter_jit`, under
        `jax.vmap`), as Optimistix raises; with several, JAX's `JaxRuntimeError`. One
        exception: inside your own plain `jax.jit` on one device, JAX raises a failed
        callback as its `JaxRuntimeError`, or as `ValueError` through its fast
        dispatch (a later call on NumPy inputs, JAX 0.10.2): there catch
        `(RuntimeError, ValueError)`, or compile with `eqx.filter_jit`.
        `EQX_ON_ERROR=nan` turns raising off.
        In a job of several processes a program cannot raise in one without leaving
        the others waiting: there `verify` raises nothing (read `result`, which every
        process holds), and [`eqx_specdec.speculative_accept`][] raises in every
        process from it.
    """
    _check_kinds(target, draft, randomness)
    if not isinstance(throw, bool):
        raise TypeError(f"verify(`throw`=...) must be a Python bool, got {throw!r}.")
    check_level(check_inputs)
    if isinstance(target, Probabilities) and history is not None:
        raise ValueError(
            "verify: `history` counts tokens for a warp's penalties, and the target is "
            "given as Probabilities (no warp): give it as Logits with a penalising "
            "Warp, or leave `history` out."
        )
    if verifier is None:
        if draft.parents is not None:
            raise TypeError(
                "verify: `draft` has `parents`: pass the tree verifier to run "
                "(`verifier=TreeVerifier()`, or TraversalVerifier())."
            )
        verifier = Verifier()
    refuse_inexact("verify", verifier, exact_only, check_inputs)
    if not isinstance(randomness, Uniforms):
        randomness = as_key(randomness)
    options = StepOptions(logprobs, allowed, draft_allowed, history, check_inputs)
    outputs, problems = verification_step(verifier, target, draft, randomness, options)
    status = status_of(problems)
    verification = Verification(
        num_accepted=outputs["num_accepted"],
        tokens=outputs["tokens"],
        **{name: outputs.get(name) for name in OPTIONAL_OUTPUTS},
        result=status.result,
        failed_row=status.row,
        messages=status.messages,
        problem=status.index,
    )
    if throw:
        verification = raise_if_failed(verification, status, draft.tokens.shape[0])
    return verification


# `speculative_accept`'s default verifier, the one `verify` runs when given none.
_STANDARD = Verifier()
# `verify`'s defaults, read once from its signature (said there alone).
_VERIFY_DEFAULTS = MappingProxyType(
    {n: p.default for n, p in inspect.signature(verify).parameters.items()}
)


def _is_default(name: str, value) -> bool:
    """Whether `value` is `verify`'s own default for its option `name`."""
    default = _VERIFY_DEFAULTS[name]
    if default is None or isinstance(value, bool):
        return value is default
    return isinstance(value, str) and value == default


@typing.no_type_check  # validated by hand, with messages naming the argument
def speculative_accept(
    draft_tokens,
    draft_probs,
    target_probs,
    accept_uniforms,
    sample_uniforms,
    *,
    verifier: AbstractVerifier = _STANDARD,
    check_inputs: CheckLevel = "read",
    logprobs: LogProbs | None = None,
    allowed: Array | None = None,
    draft_allowed: bool = True,
    exact_only: bool = False,
) -> dict[str, Array]:
    """Runs one verification step of speculative decoding on a batch.

    For each row $b$, draft token $x_i$ passes when $u_i\\, q_i(x_i) < p_i(x_i)$; the
    number accepted $n$ counts the passes before the first failure; the correction token
    $y$ is drawn by inverse CDF with uniform $s$ from
    $\\operatorname{norm}((p_n - q_n)_+)$ (or from $p_G$ when $n = G$). Those are the
    default stages; `verifier` swaps them.

    Compiled on first use with Equinox's filter semantics (as `eqx.filter_jit` does):
    every array, the arrays inside `verifier`'s stages included, is traced; every other
    value (a stage's Python `bool`, `int`, `float`, `str` or tuple fields) is static, so
    stages may use such fields in Python control flow, and each new value compiles
    once. Works as well inside `jax.jit`, `eqx.filter_jit`, `jax.vmap` and
    `eqx.filter_vmap` (over a stacked verifier, say). The only randomness is the
    supplied uniforms: the same inputs give bit-identical outputs.

    **Arguments:**

    - `draft_tokens`: integer of shape `(B, G)`, the draft tokens $x_i$, in `[0, V)`.
    - `draft_probs`: float of shape `(B, G, V)`, the distributions $q_i$ the draft tokens
        were sampled from; `None` for one-hot drafts ($q_i = \\mathrm{onehot}(x_i)$:
        n-gram, prompt-lookup and argmax drafters).
    - `target_probs`: float of shape `(B, G + 1, V)`, the target's distributions $p_i$;
        row `G` follows the last draft token.
    - `accept_uniforms`: float of shape `(B, G)`, the uniforms $u_i \\in [0, 1)$. May be
        `None` when the verifier's ratio test draws no randomness (greedy, typical).
    - `sample_uniforms`: float of shape `(B,)`, the uniforms $s \\in [0, 1)$. For a
        sampler driven by keys ([`eqx_specdec.GumbelSampler`][]), a `jax.random` key
        array of shape `(B,)`; `None` for a deterministic sampler
        ([`eqx_specdec.ArgmaxSampler`][]).
    - `verifier`: the [`eqx_specdec.AbstractVerifier`][] to run (a
        [`eqx_specdec.Verifier`][] or [`eqx_specdec.ShardedVerifier`][]). Default: the
        standard rule.
    - `check_inputs`: the run-time check level, a Python string (see the Correctness
        page for what each guarantees and costs):
        - `"read"` (the default): every value the verification reads: token ids in
            `[0, V)`, uniforms in `[0, 1)`, $p_i(x_i)$ and $q_i(x_i)$ finite and in
            `[0, 1]` at every position, the whole rows $n$ of `p` and `q` finite,
            non-negative and summing to 1 within `1e-3` (`1e-2` for float16 and
            bfloat16), and what each stage returned. Stages that read whole rows (their
            `reads` attribute) get every row checked; greedy verification, which reads
            rows 0 to n through their argmax, gets row n's checked for one.
        - `"all"`: every row of every distribution as well.
        - `"off"`: nothing; the program is the verifier's own. The outputs are still
            int32 arrays of the right shapes, their values unspecified for invalid
            inputs.

        Under `jax.jit`, mark it static: `jax.jit(speculative_accept,
        static_argnames="check_inputs")` (`eqx.filter_jit` does so by itself).
    - `logprobs`: `None` (the default: the outputs below only), or an
        [`eqx_specdec.LogProbs`][]: the outputs also hold the log-probabilities of the
        emitted tokens under the target rows given (and, with `top_k`, each emitted
        position's most likely tokens).
    - `allowed`: `None`, or each position's allowed tokens (structured output): bool
        of shape `(B, G + 1, V)`, or uint32 bits `(B, G + 1, ceil(V / 32))` (token $v$
        is bit `v % 32` of word `v // 32`). Every target row is restricted to its
        allowed tokens and renormalised, the correction and bonus rows included, so the
        emitted tokens follow the masked target; a draft token outside its mask has
        target probability 0 and is rejected.
    - `draft_allowed`: whether the draft sampled under the same mask (default `True`):
        its rows are then masked and renormalised too, as the law it drew from.
    - `exact_only`: `True` to refuse (a `ValueError`, before tracing) a verifier that is
        not exact (`verifier.exact` is False: a lossy rule, or stages built with
        `allow_mismatch=True`), and a threshold rule whose exactness is not proven with
        `check_inputs="off"` (only the run-time checks verify its bound): for users who
        must not change the distribution. Default `False`.

    **Returns:**

    A dict with `"num_accepted"`, int32 of shape `(B,)`, and `"tokens"`, int32 of shape
    `(B, G + 1)`: the accepted draft tokens, the correction token, then `-1`.

    **Raises:**

    - `ValueError`: at trace time, when a rank or shape is wrong or the shapes disagree;
        the message names the argument, the expected shape and the one received.
    - `TypeError`: at trace time, when `draft_tokens` is not integer or a probability or
        uniform array is not floating, or `verifier` is not a `Verifier`.
    - `RuntimeError`: when a checked value is
        invalid or a stage returned a value outside its contract, as for
        [`eqx_specdec.verify`][] (which this calls: one compiled program for both).

    The contract's form of [`eqx_specdec.verify`][], and exactly this:
    `verify(Probabilities(target_probs), Draft(draft_tokens,
    Probabilities(draft_probs)), Uniforms(accept_uniforms, sample_uniforms),
    ...).as_dict()`. Logits, a key, trees: call `verify`.
    """
    q = None if draft_probs is None else Probabilities(draft_probs)
    # The options given as `verify` would get them when called with the same ones
    # (`eqx.filter_jit` keys its programs on the arguments as passed): the same call of
    # `verify` runs the same compiled program.
    given = dict(
        verifier=None if verifier is _STANDARD else verifier,
        check_inputs=check_inputs,
        logprobs=logprobs,
        allowed=allowed,
        draft_allowed=draft_allowed,
        exact_only=exact_only,
    )
    options = {k: v for k, v in given.items() if not _is_default(k, v)}
    verification = verify(
        Probabilities(target_probs),
        Draft(draft_tokens, q),
        Uniforms(accept_uniforms, sample_uniforms),
        **options,
    )
    raise_on_host(verification)
    return verification.as_dict()
