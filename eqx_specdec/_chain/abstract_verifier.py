"""The base every chain verifier shares, and the one-row pipeline its stages run in."""

import abc
import inspect
from types import MappingProxyType
from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from equinox import AbstractVar
from jaxtyping import Array, Bool, Float, Int

from .._backend.abstract_row_mapping import stops_at_failure
from .._custom_types import (
    AcceptUniforms,
    DraftProbs,
    DraftTokens,
    SampleRandomnessBatch,
    TargetProbs,
)
from .._stages.prefix_counter import AbstractPrefixCounter
from .._stages.ratio_test import AbstractRatioTest
from .._stages.residual_sampler import AbstractResidualSampler
from .._stages.row_context import ONE_DEVICE, RowContext
from .._stages.row_sums import row_sums, RowSums
from .._stages.token_assembler import AbstractTokenAssembler
from .._stages.verdict import Verdict


STAGE_BASES = MappingProxyType(
    {
        "ratio_test": AbstractRatioTest,
        "prefix_counter": AbstractPrefixCounter,
        "residual_sampler": AbstractResidualSampler,
        "token_assembler": AbstractTokenAssembler,
    }
)


class RowReport(NamedTuple):
    """What a checked verification returns beside its outputs, per row, for the
    run-time checks (computed on the whole batch afterwards, so the row loop does no
    extra work): the ratio test's residual scales and the sampler's token (`None` when
    the verifier does not expose them), and with value checks in the rows, the
    [`eqx_specdec.RowSums`][] of rows n and the gathered
    $p_i(x_i)$, $q_i(x_i)$; for a threshold rule that declares itself exact without
    proof, whether it accepted more than the target holds on row n (`excess`); on warped
    logits, the log-normalisers of the target's and the draft's rows the verification
    read (`normalisers`, 0 for a row whose logits cannot change the outputs)."""

    residual_scale: Float[Array, "*B G"] | None = None
    correction: Int[Array, "*B"] | None = None
    sums: RowSums | None = None
    gathered: tuple | None = None
    excess: Bool[Array, "*B"] | None = None
    normalisers: tuple | None = None


def malformed_tokens(tokens, num_accepted, vocab: int):
    """Whether the emitted tokens break the contract's layout: ids in `[0, V)` up to
    position n, then -1 (any leading batch dimensions)."""
    position = jax.lax.broadcasted_iota(jnp.int32, tokens.shape, tokens.ndim - 1)
    inside = (tokens >= 0) & (tokens < vocab)
    n = jnp.asarray(num_accepted)[..., None]
    return jnp.any(jnp.where(position <= n, ~inside, tokens != -1), axis=-1)


class AbstractVerifier(eqx.Module):
    """A verifier of a chain of draft tokens, made of the four stages.

    [`eqx_specdec.Verifier`][] (one device) and [`eqx_specdec.ShardedVerifier`][]
    (several) implement it; every entry point takes either.

    **Declared by every subclass:**

    - `ratio_test`, `prefix_counter`, `residual_sampler`, `token_assembler`: the stages.

    **Class attribute:** `draft_shape = "chain"`, the shape of the drafts it verifies
    (the proposals and tools read this, not the class: a family of your own declares
    its own).
    """

    draft_shape: ClassVar[str] = "chain"
    ratio_test: AbstractVar[AbstractRatioTest]
    prefix_counter: AbstractVar[AbstractPrefixCounter]
    residual_sampler: AbstractVar[AbstractResidualSampler]
    token_assembler: AbstractVar[AbstractTokenAssembler]

    @property
    def exact(self) -> bool:
        """Whether the verifier is exact: its emitted tokens follow the ratio test's
        target (for greedy rules, greedy decoding of it) exactly. True when the
        ratio test declares `exact = True` and the counter and sampler fit it (their
        `counts` and `draws` equal those of the test's own `counter` and `sampler`).
        A Python bool, known before tracing; [`eqx_specdec.evaluation.evaluate_verifier`][]
        holds it to its claim."""
        return self.ratio_test.exact and not stage_mismatches(
            self.ratio_test, self.prefix_counter, self.residual_sampler
        )

    @abc.abstractmethod
    def __call__(
        self,
        draft_tokens: DraftTokens,
        draft_probs: DraftProbs | None,
        target_probs: TargetProbs,
        accept_uniforms: AcceptUniforms,
        sample_uniforms: SampleRandomnessBatch,
        *,
        log_space: bool = False,
    ) -> dict[str, Int[Array, "..."]]:
        """Verifies a batch; arguments and return value as for
        [`eqx_specdec.speculative_accept`][], on inputs already checked, given as
        log-probabilities when `log_space=True`."""

    def checked_call(
        self,
        draft_tokens: DraftTokens,
        draft_probs: DraftProbs | None,
        target_probs: TargetProbs,
        accept_uniforms: AcceptUniforms,
        sample_uniforms: SampleRandomnessBatch,
        *,
        values: bool,
        log_space: bool = False,
    ) -> tuple[dict[str, Int[Array, "..."]], RowReport]:
        """Verifies a batch as `__call__` does, and reports per row whether a stage
        returned a value outside its contract (and, with `values=True`, the values of
        rows n the stages read; see [`eqx_specdec.speculative_accept`][]'s check levels).

        The entry points call this when `check_inputs` is on. The default runs
        `__call__` and checks its outputs only (the number accepted in `[0, G]`, the
        tokens laid out as the contract says), reporting no values, so the entry point
        checks whole rows; a subclass may override it to check inside its rows.
        """
        outputs = self(
            draft_tokens,
            draft_probs,
            target_probs,
            accept_uniforms,
            sample_uniforms,
            log_space=log_space,
        )
        return outputs, RowReport()

    def at_lengths(
        self,
        lengths: Int[Array, " B"],
        draft_tokens: DraftTokens,
        draft_probs: DraftProbs | None,
        target_probs: TargetProbs,
        accept_uniforms: AcceptUniforms,
        sample_uniforms: SampleRandomnessBatch,
    ) -> dict[str, Int[Array, "..."]]:
        """Verifies row $b$ as a chain of its own length `lengths[b]` in $[1, G]$ (the
        draft-length policies of [`eqx_specdec.speculative_decode`][]), its tokens
        padded with -1 to $G + 1$.

        The default runs `__call__` once per length on the sliced inputs (a static shape
        each) and gives each row the outputs of its length; a subclass that verifies
        rows one by one may override it to verify each row once.
        """
        gamma = draft_tokens.shape[1]
        counts, tokens = [], []
        for size in range(1, gamma + 1):
            out = self(
                draft_tokens[:, :size],
                None if draft_probs is None else draft_probs[:, :size],
                target_probs[:, : size + 1],
                accept_uniforms[:, :size],
                sample_uniforms,
            )
            pad = jnp.full((draft_tokens.shape[0], gamma - size), -1, jnp.int32)
            counts.append(out["num_accepted"])
            tokens.append(jnp.concatenate([out["tokens"], pad], axis=1))
        index = (jnp.clip(lengths, 1, gamma) - 1)[:, None]
        num_accepted = jnp.take_along_axis(jnp.stack(counts, 1), index, axis=1)[:, 0]
        chosen = jnp.take_along_axis(jnp.stack(tokens, 1), index[..., None], axis=1)
        return {"num_accepted": num_accepted.astype(jnp.int32), "tokens": chosen[:, 0]}


def stage_mismatches(
    ratio_test: AbstractRatioTest,
    prefix_counter: AbstractPrefixCounter,
    residual_sampler: AbstractResidualSampler,
) -> list[str]:
    """What does not fit `ratio_test` among the other stages: for each of the counter
    and sampler whose declaration (`counts`, `draws`) differs from that of the test's
    own `counter` and `sampler`, a sentence naming both stages."""
    test = type(ratio_test).__name__
    found = []
    for role, stage, needed, key in (
        ("prefix_counter", prefix_counter, ratio_test.counter, "counts"),
        ("residual_sampler", residual_sampler, ratio_test.sampler, "draws"),
    ):
        have, want = getattr(stage, key), getattr(needed, key)
        if have != want:
            found.append(
                f"`{role}` {type(stage).__name__} ({key} {have!r}) does not fit "
                f"{test}, whose law needs {type(needed).__name__} ({key} {want!r})"
            )
    return found


# The positional arguments the pipeline passes to the stages that read the rows, the
# last of them the RowContext.
_ARGUMENTS = MappingProxyType({"ratio_test": 5, "residual_sampler": 7})


def check_stages(owner: str, stages: dict):
    """Construction-time check that each stage is an instance of its base, and that a
    stage reading the rows takes its `context`."""
    for name, base in STAGE_BASES.items():
        stage = stages[name]
        if not isinstance(stage, base):
            raise TypeError(
                f"{owner}(`{name}`=...) must be an instance of {base.__name__}, got "
                f"{type(stage).__name__}. Subclass {base.__name__} to write a custom "
                "stage."
            )
        for leaf in jax.tree.leaves(stage):
            if not eqx.is_array(leaf) and not _hashable(leaf):
                raise TypeError(
                    f"{owner}(`{name}`=...): {type(stage).__name__} holds a "
                    f"{type(leaf).__name__}, which is neither an array nor hashable. "
                    "Non-array fields of stages are static (compiled in): make it an "
                    "array (traced) or a hashable value (a tuple, not a list or dict "
                    "inside a field)."
                )
        if name in _ARGUMENTS and not _takes(type(stage).__call__, _ARGUMENTS[name]):
            stage_name = type(stage).__name__
            raise TypeError(
                f"{stage_name}.__call__ must take {_ARGUMENTS[name]} arguments after "
                f"`self`, as {base.__name__}.__call__ does; the last is `context`, the "
                "eqx_specdec.RowContext that says whether the rows hold probabilities "
                "or log-probabilities (and which slice of the vocabulary). Add it: "
                f"`def __call__(self, ..., context)`."
            )


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _takes(method, count: int) -> bool:
    """Whether `method` (unbound) accepts `count` positional arguments after `self`."""
    try:
        parameters = list(inspect.signature(method).parameters.values())[1:]
    except (TypeError, ValueError):  # no signature to read: let the call decide
        return True
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return True
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )
    return sum(p.kind in positional for p in parameters) >= count


def _describe(value) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{value.dtype}{list(value.shape)}"
    return type(value).__name__


_KINDS = MappingProxyType(
    {
        "boolean": lambda d: d == jnp.bool_,
        "integer": lambda d: jnp.issubdtype(d, jnp.integer),
        "floating": lambda d: jnp.issubdtype(d, jnp.floating),
    }
)


def _checked(stage, method: str, what: str, value, shape: tuple, kind: str):
    """Trace-time check of what a stage returned, so a faulty custom stage fails loudly
    where it is, not as a wrong token later."""
    if (
        not hasattr(value, "shape")
        or tuple(value.shape) != shape
        or not _KINDS[kind](value.dtype)
    ):
        base = next(b for b in STAGE_BASES.values() if isinstance(stage, b))
        raise TypeError(
            f"{type(stage).__name__} returned {_describe(value)} as {what}, but "
            f"{base.__name__}.{method} must return "
            f"{'an' if kind == 'integer' else 'a'} {kind} array of shape {shape}."
        )
    return value


def verify_row(
    verifier: AbstractVerifier,
    draft_tokens,
    draft_probs,
    target_probs,
    accept_uniforms,
    sample_uniform,
    context: RowContext = ONE_DEVICE,
    *,
    report: bool = False,
    values: bool = False,
    sampled=None,
    taken=None,
    decided=None,
    rows_n=None,
    argmaxes=None,
    normalisers=None,
):
    """Runs the four stages on one row, checking at trace time what each returns; the
    ratio test and sampler get `context` (the rows' space, and the vocabulary shard
    inside a [`eqx_specdec.ShardedVerifier`][]).

    `taken`: `(p_x, q_x)`, this row's draft tokens' values gathered with the batch's
    (`q_x` `None` for one-hot drafts), which `context.gather` returns for this row's
    arrays; `argmaxes`: this row's from the ratio test's `argmax_pass` over the batch,
    which `context.argmax` returns for this row's `target_probs`.

    `decided`: `(verdict, n)`, this row's from `decide_row`, run before with the
    batch's; `rows_n`: this row's part of the sampler's `rows_n_pass` over the batch
    (`RowsN`), which the sampler reads through `context.rows_n`.

    `normalisers`: `(target, draft)`, the log-normalisers `(G + 1,)` and `(G,)` (or
    `None`) of this row's warped logits, as the warp found them
    (`row_normalisers`), which the report keeps for the rows the verification read.

    `sampled`: `(draft_probs, target_probs)` for the sampler (and the sums of rows n)
    to read instead of the test's: the same values, computed apart, where they are
    evaluated from warped logits (so that XLA evaluates for the sampler its rows n
    alone, not every row for each reader).

    Returns the outputs; with `report=True`, `(outputs, RowReport)`: what the stages
    returned, and with `values=True` the sums of rows n (from the sampler's
    `draw_and_sum`) and the gathered draft tokens' values."""
    gamma = draft_tokens.shape[0]
    context = _with_passes(
        context, draft_tokens, draft_probs, target_probs, taken, argmaxes
    )
    sampler = verifier.residual_sampler
    if decided is None:
        decided = decide_row(
            verifier, draft_tokens, draft_probs, target_probs, accept_uniforms, context
        )
    verdict, n = decided
    if sampled is not None:
        draft_probs, target_probs = sampled
    if rows_n is not None:
        context = context.with_rows_n(draft_tokens, draft_probs, target_probs, rows_n)
    inputs = (n, verdict, draft_tokens, draft_probs, target_probs, sample_uniform)
    sums = None
    if values and context.shard is None:
        y, sums = sampler.draw_and_sum(*inputs, context)
        if not isinstance(sums, RowSums):
            raise TypeError(
                f"{type(sampler).__name__}.draw_and_sum returned {_describe(sums)} as "
                "its sums, but AbstractResidualSampler.draw_and_sum must return "
                "`(token, RowSums(...))`."
            )
    else:
        y = sampler(*inputs, context)
        if values:  # this shard's parts, summed over the shards
            local = row_sums(n, draft_probs, target_probs)
            sums = RowSums(context.sum(local.p_total), context.sum(local.q_total))
    y = _checked(sampler, "__call__", "the correction token", y, (), "integer")
    y = y.astype(jnp.int32)
    assembler = verifier.token_assembler
    tokens = assembler(n, draft_tokens, y)
    tokens = _checked(assembler, "__call__", "tokens", tokens, (gamma + 1,), "integer")
    outputs = {"num_accepted": n, "tokens": tokens.astype(jnp.int32)}
    if not report:
        return outputs
    gathered = None
    if values:
        gathered = context.gather(draft_tokens, draft_probs, target_probs)
    excess = None
    rule = verdict.rule
    if rule is not None and rule.exact and not rule.proven:
        excess = _excess(rule, n, draft_tokens, draft_probs, target_probs, context)
    if normalisers is not None:
        normalisers = _of_rows_read(verifier, n, normalisers)
    report = RowReport(verdict.residual_scale, y, sums, gathered, excess, normalisers)
    return outputs, report


def _of_rows_read(verifier, n, normalisers):
    """`normalisers` `(target, draft)` of the rows the verification read: rows 0 to n
    where nothing after the first failure changes the outputs (`stops_at_failure`),
    every row otherwise; 0 (nothing to report) for the others."""
    if not stops_at_failure(verifier):
        return normalisers

    def read(rows):
        position = jnp.arange(rows.shape[0], dtype=jnp.int32)
        return jnp.where(position <= n, rows, jnp.zeros_like(rows))

    target, draft = normalisers
    return read(target), None if draft is None else read(draft)


def decide_row(
    verifier: AbstractVerifier,
    draft_tokens,
    draft_probs,
    target_probs,
    accept_uniforms,
    context: RowContext = ONE_DEVICE,
    *,
    taken=None,
    argmaxes=None,
):
    """The ratio test and the prefix counter on one row, checking at trace time what
    each returns: `(verdict, n)`, `n` int32. `taken`, `argmaxes`: as for
    `verify_row`."""
    gamma = draft_tokens.shape[0]
    context = _with_passes(
        context, draft_tokens, draft_probs, target_probs, taken, argmaxes
    )
    test = verifier.ratio_test
    verdict = test(draft_tokens, draft_probs, target_probs, accept_uniforms, context)
    if not isinstance(verdict, Verdict):
        raise TypeError(
            f"{type(test).__name__} returned {_describe(verdict)}, but "
            "AbstractRatioTest.__call__ must return an eqx_specdec.Verdict."
        )
    _checked(test, "__call__", "Verdict.passed", verdict.passed, (gamma,), "boolean")
    _checked(
        test,
        "__call__",
        "Verdict.residual_scale",
        verdict.residual_scale,
        (gamma,),
        "floating",
    )
    counter = verifier.prefix_counter
    n = counter(verdict.passed)
    n = _checked(counter, "__call__", "num_accepted", n, (), "integer")
    return verdict, n.astype(jnp.int32)


def _with_passes(context, draft_tokens, draft_probs, target_probs, taken, argmaxes):
    """`context` holding what the batch's passes gave for this row's arrays."""
    if taken is not None:
        context = context.with_taken(draft_tokens, draft_probs, target_probs, taken)
    if argmaxes is not None:
        context = context.with_argmax(target_probs, argmaxes)
    return context


def _excess(rule, n, draft_tokens, draft_probs, target_probs, context):
    """Whether a threshold rule accepted more than the target holds on row n, where its
    correction is drawn: $\\min(q_n, t_n) > p_n$ somewhere (its derived correction is
    then not exact). One more pass over rows n, for rules declared exact without
    proof only."""
    gamma = draft_tokens.shape[0]
    at = jnp.minimum(n, gamma - 1)
    p = context.probabilities(target_probs[at])
    if draft_probs is None:
        q = (context.token_ids(p.shape[0]) == draft_tokens[at]).astype(p.dtype)
    else:
        q = context.probabilities(draft_probs[at]).astype(p.dtype)
    over = context.sum(rule.excess(p, q).astype(jnp.int32)) > 0
    return (n < gamma) & over
