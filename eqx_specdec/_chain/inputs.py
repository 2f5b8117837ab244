"""What every entry point does with its inputs before verifying: convert, check shapes
and dtypes at trace time, fill in unused randomness, and list the run-time checks."""

import typing
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Integer, Key

from .._inputs.checks import (
    bad_sum_message,
    distribution_problems,
    logit_problems,
    stage_problem,
    sum_tolerance,
    token_problems,
    uniform_problems,
)
from .._inputs.results import Problem, RESULTS
from .._inputs.typed_inputs import as_array
from .abstract_verifier import AbstractVerifier, malformed_tokens, RowReport


def _shape(x) -> str:
    return "(" + ", ".join(str(d) for d in x.shape) + ")"


def is_key(x) -> bool:
    """Whether `x` is an array of typed `jax.random` keys."""
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


class StepArguments(NamedTuple):
    """The five arguments of one verification step by name: their values, or what an
    entry point calls them (for messages)."""

    draft_tokens: str = "draft_tokens"
    draft: str = "draft_probs"
    target: str = "target_probs"
    accept: str = "accept_uniforms"
    sample: str = "sample_uniforms"


LOGIT_NAMES = StepArguments(draft="draft_logits", target="target_logits")
TREE_NAMES = StepArguments(draft_tokens="node_tokens")
TREE_LOGIT_NAMES = LOGIT_NAMES._replace(draft_tokens="node_tokens")


class PreparedInputs(eqx.Module):
    """Validated inputs of one verification step, as `AbstractVerifier.__call__` takes
    them (`arrays()`), with what the run-time checks need to know."""

    draft_tokens: Integer[Array, "B G"]
    draft: Float[Array, "B G V"] | None
    target: Float[Array, "B G+1 V"]
    accept: Float[Array, "B G"]
    sample: Float[Array, " B"] | Key[Array, " B"]
    names: StepArguments = eqx.field(static=True)
    log_space: bool = eqx.field(static=True)
    check_accept: bool = eqx.field(static=True)
    check_sample: bool = eqx.field(static=True)

    def arrays(self) -> tuple:
        """The five arguments of `AbstractVerifier.__call__`, in order."""
        return self.draft_tokens, self.draft, self.target, self.accept, self.sample

    def values_in_rows(self, verifier: AbstractVerifier, level) -> bool:
        """Whether the checks at `level` may validate only the values the stages read
        (rows n and the draft tokens' entries) inside the rows: at the default level, on
        probabilities, when the ratio test reads the draft tokens' entries only and the
        sampler rows n only (their `reads`)."""
        return (
            level == "read"
            and not self.log_space
            and verifier.ratio_test.reads == "draft tokens"
            and verifier.residual_sampler.reads == "row n"
        )

    def argmax_in_rows(self, verifier: AbstractVerifier, level) -> bool:
        """Whether the checks at `level` may validate only what greedy verification
        reads: at the default level, when the ratio test reads the rows through their
        argmax alone and the sampler draws row n's (their `reads` and `draws`). The
        rows read are the target's up to row n, each only through its argmax; a row
        before n had one (its draft token), so the one that can lack a most likely
        entry (a NaN or $+\\infty$, or no mass) is row n, whose correction is then -1.
        The checks then read no row the verification does not."""
        return (
            level == "read"
            and verifier.ratio_test.reads == "argmax"
            and verifier.residual_sampler.draws == "argmax"
        )

    def problems(
        self,
        verifier: AbstractVerifier,
        outputs: dict,
        report: RowReport,
        more_inputs: tuple = (),
        *,
        argmax_only: bool = False,
        rows_read: bool = False,
    ) -> list:
        """The run-time problems, in the order they are reported: the inputs (whole
        arrays, or the values the stages read when the report has them; then
        `more_inputs`, the caller's own input problems), then the stages' outputs (an
        invalid input explains a stage's odd output, never the reverse). Batched
        operations on per-row values, after the row loop. `argmax_only`: the rows
        are checked through the sampler's token alone (`argmax_in_rows`); `rows_read`:
        warped logits are checked in the rows the verification read alone, through
        their log-normalisers as the warp found them (`RowReport.normalisers`), where
        the report has them."""
        names = self.names
        vocab = self.target.shape[-1]
        problems = token_problems(self.draft_tokens, vocab, names.draft_tokens)
        for index, name, array in (
            (1, names.draft, self.draft),
            (0, names.target, self.target),
        ):
            if array is None:
                continue
            if argmax_only and report.correction is not None:
                if index == 0:
                    problems += _argmax_problems(name, report, self.log_space)
                continue
            if self.log_space and rows_read and report.normalisers is not None:
                normalisers = report.normalisers[0 if index == 0 else 1]
                problems += logit_problems(name, normalisers=normalisers)
            elif self.log_space:
                problems += logit_problems(name, array)
            elif report.sums is not None:
                problems += _read_problems(name, array.dtype, report, index, outputs)
            else:
                problems += distribution_problems(name, array)
        if self.check_accept:
            problems += uniform_problems(names.accept, self.accept)
        if self.check_sample:
            problems += uniform_problems(names.sample, self.sample)
        problems += list(more_inputs)
        return problems + stage_problems(verifier, outputs, report, vocab)


def _argmax_problems(name, report: RowReport, log_space: bool) -> list:
    """The problem of the one row greedy verification reads that can lack a most
    likely entry, row n: its correction is then -1."""
    if log_space:
        what, fix = "a NaN or +inf logit, or only -inf", "Mask a token with -inf."
    else:
        what = "a NaN or infinite value, or no positive entry"
        fix = "Pass finite probabilities >= 0 with some mass."
    return [
        Problem(
            report.correction == -1,
            RESULTS.invalid_logit if log_space else RESULTS.invalid_probability,
            f"`{name}` has no most likely token in row {{row}} (the first such row) at "
            f"the position where the verification stopped: {what}. {fix}",
        )
    ]


def _read_problems(name, dtype, report: RowReport, index: int, outputs: dict) -> list:
    """The problems of a distribution from what the rows read of it: row n's sum (NaN
    if an entry is negative or NaN), and the gathered entries at the draft tokens
    (`index` 0 for `p`, 1 for `q`). `q` has no row n when every draft token was
    accepted (the sums then cover its last row, which nothing reads)."""
    total = report.sums.p_total if index == 0 else report.sums.q_total
    if index == 1:
        gamma = outputs["tokens"].shape[-1] - 1
        total = jnp.where(outputs["num_accepted"] < gamma, total, 1).astype(total.dtype)
    gathered = report.gathered[index]
    invalid = ~jnp.isfinite(total) | jnp.any(
        ~jnp.isfinite(gathered) | (gathered < 0), axis=-1
    )
    bad_sum = (jnp.abs(total - 1) > sum_tolerance(dtype)) | jnp.any(
        gathered > 1 + sum_tolerance(dtype), axis=-1
    )
    return [
        Problem(
            invalid,
            RESULTS.invalid_probability,
            f"`{name}` holds a NaN, infinite or negative value in row {{row}} (the first "
            "such row), where the verification reads it. Pass finite probabilities "
            ">= 0: a softmax of finite logits (a masked token has probability 0), "
            "rounding noise clipped by `jnp.maximum(probs, 0)`.",
        ),
        Problem(
            bad_sum & ~invalid, RESULTS.not_normalised, bad_sum_message(name, dtype)
        ),
    ]


def stage_problems(
    verifier: AbstractVerifier, outputs: dict, report: RowReport, vocab: int
) -> list:
    """The problems of stages that returned values outside their contracts, checked on
    the outputs and on what the report exposes (the ratio test's residual scales, the
    sampler's token)."""
    n, tokens = outputs["num_accepted"], outputs["tokens"]
    gamma = tokens.shape[-1] - 1
    problems = []
    if report.residual_scale is not None:
        problems.append(
            stage_problem(
                verifier.ratio_test,
                "ratio test",
                ~jnp.all(jnp.isfinite(report.residual_scale), axis=-1),
                "a NaN or infinite `Verdict.residual_scale`",
                "the residual scale must be finite (1 for the standard residual).",
            )
        )
    if report.excess is not None:
        name = type(verifier.ratio_test).__name__
        problems.append(
            Problem(
                report.excess,
                RESULTS.not_exact,
                f"{name} (the ratio test) accepts more of some token than the target "
                "holds, min(q, t) > p, on the row its correction is drawn from, in row "
                "{row} (the first such row): with it the verifier is not exact, though "
                f"{name} declares `exact = True`. Fix {name}: make its acceptance t at "
                "most p wherever t < q (for example t = c p with c <= 1), or declare "
                "`exact = False` for a rule that is lossy on purpose.",
            )
        )
    problems.append(
        stage_problem(
            verifier.prefix_counter,
            "prefix counter",
            (n < 0) | (n > gamma),
            f"a number accepted outside [0, G] = [0, {gamma}]",
            "it must return how many draft tokens are accepted, from 0 to G.",
        )
    )
    if report.correction is not None:
        y = report.correction
        problems.append(
            stage_problem(
                verifier.residual_sampler,
                "residual sampler",
                (y < 0) | (y >= vocab),
                f"a correction token outside [0, V) = [0, {vocab})",
                "it must return a token id of the target's vocabulary.",
            )
        )
    problems.append(
        stage_problem(
            verifier.token_assembler,
            "token assembler",
            malformed_tokens(tokens, n, vocab),
            "tokens not laid out as the contract says",
            "it must return the n accepted draft tokens, the correction token, then "
            "-1 (token ids in [0, V)).",
        )
    )
    return problems


class _Layout(NamedTuple):
    rank: int
    chain: str
    tree: str


_LAYOUTS = StepArguments(
    _Layout(2, "(B, G)", "(B, N)"),
    _Layout(3, "(B, G, V)", "(B, N+1, V)"),
    _Layout(3, "(B, G+1, V)", "(B, N+1, V)"),
    _Layout(2, "(B, G)", "(B, N)"),
    _Layout(1, "(B,)", "(B,)"),
)


def validate_step(arrays: StepArguments, names: StepArguments, *, tree: bool = False):
    """Trace-time checks of ranks, shapes and dtypes of one step's five arguments, with
    messages naming the argument: for a chain (G draft tokens; G draft rows, G + 1
    target rows) or, with `tree=True`, a tree (N nodes; N + 1 rows of each, one per
    context)."""
    for x, name, layout in zip(arrays, names, _LAYOUTS):
        text = layout.tree if tree else layout.chain
        if x is not None and x.ndim != layout.rank:
            raise ValueError(
                f"`{name}` must have rank {layout.rank}, shape {text}; got shape "
                f"{_shape(x)}."
            )
    if not jnp.issubdtype(arrays.draft_tokens.dtype, jnp.integer):
        raise TypeError(
            f"`{names.draft_tokens}` must have an integer dtype (token ids), got "
            f"{arrays.draft_tokens.dtype}. Cast with `.astype(jnp.int32)`."
        )
    floats = [
        (arrays.draft, names.draft),
        (arrays.target, names.target),
        (arrays.accept, names.accept),
    ]
    if arrays.sample is not None and not is_key(arrays.sample):
        floats.append((arrays.sample, names.sample))
    for x, name in floats:
        if x is not None and not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(
                f"`{name}` must have a floating dtype (float16, bfloat16, float32 or "
                f"float64), got {x.dtype}."
            )
    batch, gamma = arrays.draft_tokens.shape
    vocab = arrays.target.shape[2]
    if gamma < 1:
        raise ValueError(
            f"`{names.draft_tokens}` must hold at least one draft token per row; got "
            f"shape {_shape(arrays.draft_tokens)}."
        )
    if vocab < 1:
        raise ValueError(
            f"`{names.target}` has an empty vocabulary: {_shape(arrays.target)}."
        )
    draft_rows = gamma + 1 if tree else gamma
    expected = StepArguments(
        None,
        (batch, draft_rows, vocab),
        (batch, gamma + 1, vocab),
        (batch, gamma),
        (batch,),
    )
    if tree:
        why = " (one row per context: the root's, then each node's)"
    else:
        why = f" (one row more than `{names.draft}`, for the bonus token)"
    for x, name, shape, layout in zip(arrays, names, expected, _LAYOUTS):
        if x is None or shape is None or tuple(x.shape) == shape:
            continue
        text = layout.tree if tree else layout.chain
        raise ValueError(
            f"`{name}` must have shape {text} = {shape} to match "
            f"`{names.draft_tokens}` {_shape(arrays.draft_tokens)} and "
            f"`{names.target}` vocabulary {vocab}"
            f"{why if name == names.target else ''}; got {_shape(x)}."
        )


@typing.no_type_check  # validated by hand, with messages naming the argument
def prepare_inputs(
    entry_point: str,
    verifier: AbstractVerifier,
    arrays: tuple,
    *,
    log_space: bool,
    names: StepArguments = StepArguments(),
) -> PreparedInputs:
    """Converts and checks (at trace time) the five arguments of one verification step,
    and fills in the randomness the verifier's stages do not draw."""
    if not isinstance(verifier, AbstractVerifier):
        raise TypeError(
            "`verifier` must be an eqx_specdec.Verifier (or ShardedVerifier, or another "
            f"AbstractVerifier), got {type(verifier).__name__}."
        )
    arrays = StepArguments(*(as_array(x) for x in arrays))
    if arrays.target is None:
        raise TypeError(f"`{names.target}` is required.")
    validate_step(arrays, names)
    batch, gamma = arrays.draft_tokens.shape
    accept, sample = arrays.accept, arrays.sample

    ratio_test, sampler = verifier.ratio_test, verifier.residual_sampler
    check_accept = accept is not None
    if accept is None:
        if ratio_test.uses_uniforms:
            raise TypeError(
                f"`{names.accept}` is None, but {type(ratio_test).__name__} draws "
                f"uniforms: pass a float array of shape (B, G) = {(batch, gamma)}."
            )
        accept = jnp.zeros((batch, gamma), jnp.float32)
    check_sample = sample is not None and not is_key(sample)
    if sampler.randomness == "key":
        if sample is None or not is_key(sample):
            raise TypeError(
                f"{type(sampler).__name__} draws from one `jax.random` key per row: pass "
                f"`{names.sample}=jax.random.split(key, {batch})`, or call "
                "`verify` with a `jax.random` key as its randomness."
            )
        check_sample = False
    elif sample is None:
        if sampler.randomness != "none":
            raise TypeError(
                f"`{names.sample}` is None, but {type(sampler).__name__} draws a "
                f"uniform per row: pass a float array of shape (B,) = ({batch},)."
            )
        sample = jnp.zeros((batch,), jnp.float32)
    elif is_key(sample):
        raise TypeError(
            f"`{names.sample}` holds `jax.random` keys, but {type(sampler).__name__} "
            "takes a float uniform per row."
        )
    return PreparedInputs(
        arrays.draft_tokens,
        arrays.draft,
        arrays.target,
        accept,
        sample,
        names,
        log_space,
        check_accept,
        check_sample,
    )
