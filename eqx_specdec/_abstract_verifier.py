"""The base every chain verifier shares, and the one-row pipeline its stages run in."""

import abc
from types import MappingProxyType

import equinox as eqx
import jax.numpy as jnp
from equinox import AbstractClassVar, AbstractVar
from jaxtyping import Array, Int

from ._custom_types import (
    AcceptUniforms,
    DraftProbs,
    DraftTokens,
    SampleRandomnessBatch,
    TargetProbs,
)
from ._stages.assemblers import AbstractTokenAssembler
from ._stages.prefix_counters import AbstractPrefixCounter
from ._stages.ratio_tests import AbstractRatioTest
from ._stages.samplers import AbstractResidualSampler
from ._stages.verdict import Verdict
from ._vocab_shard import VocabShard


STAGE_BASES = MappingProxyType(
    {
        "ratio_test": AbstractRatioTest,
        "prefix_counter": AbstractPrefixCounter,
        "residual_sampler": AbstractResidualSampler,
        "token_assembler": AbstractTokenAssembler,
    }
)


class AbstractVerifier(eqx.Module):
    """A verifier of a chain of draft tokens, made of the four stages.

    [`eqx_specdec.Verifier`][] (one device) and [`eqx_specdec.ShardedVerifier`][]
    (several) implement it; every entry point takes either.

    **Declared by every subclass:**

    - `ratio_test`, `prefix_counter`, `residual_sampler`, `token_assembler`: the stages.
    - `defers_value_checks` (class attribute): whether the run-time value checks must be
        raised after the program finishes rather than from inside it (programs over
        several devices, where an error on one device would leave the others waiting).
    """

    ratio_test: AbstractVar[AbstractRatioTest]
    prefix_counter: AbstractVar[AbstractPrefixCounter]
    residual_sampler: AbstractVar[AbstractResidualSampler]
    token_assembler: AbstractVar[AbstractTokenAssembler]
    defers_value_checks: AbstractClassVar[bool]

    @abc.abstractmethod
    def __call__(
        self,
        draft_tokens: DraftTokens,
        draft_probs: DraftProbs | None,
        target_probs: TargetProbs,
        accept_uniforms: AcceptUniforms,
        sample_uniforms: SampleRandomnessBatch,
    ) -> dict[str, Int[Array, "..."]]:
        """Verifies a batch; arguments and return value as for
        [`eqx_specdec.speculative_accept`][], on inputs already checked."""


def check_stages(owner: str, stages: dict):
    """Construction-time check that each stage is an instance of its base."""
    for name, base in STAGE_BASES.items():
        stage = stages[name]
        if not isinstance(stage, base):
            raise TypeError(
                f"{owner}(`{name}`=...) must be an instance of {base.__name__}, got "
                f"{type(stage).__name__}. Subclass {base.__name__} to write a custom "
                "stage."
            )


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
    shard: VocabShard | None = None,
) -> dict[str, Int[Array, "..."]]:
    """Runs the four stages on one row, checking at trace time what each returns. With
    `shard`, the ratio test and sampler run in their vocabulary-parallel form."""
    gamma = draft_tokens.shape[0]
    test, sampler = verifier.ratio_test, verifier.residual_sampler
    if shard is None:
        method = "__call__"
        verdict = test(draft_tokens, draft_probs, target_probs, accept_uniforms)
    else:
        method = "vocab_parallel"
        verdict = test.vocab_parallel(
            shard, draft_tokens, draft_probs, target_probs, accept_uniforms
        )
    if not isinstance(verdict, Verdict):
        raise TypeError(
            f"{type(test).__name__} returned {_describe(verdict)}, but "
            f"AbstractRatioTest.{method} must return an eqx_specdec.Verdict."
        )
    _checked(test, method, "Verdict.passed", verdict.passed, (gamma,), "boolean")
    _checked(
        test,
        method,
        "Verdict.residual_scale",
        verdict.residual_scale,
        (gamma,),
        "floating",
    )
    counter = verifier.prefix_counter
    n = counter(verdict.passed)
    n = _checked(counter, "__call__", "num_accepted", n, (), "integer")
    n = n.astype(jnp.int32)
    inputs = (n, verdict, draft_tokens, draft_probs, target_probs, sample_uniform)
    y = sampler(*inputs) if shard is None else sampler.vocab_parallel(shard, *inputs)
    y = _checked(sampler, method, "the correction token", y, (), "integer")
    y = y.astype(jnp.int32)
    assembler = verifier.token_assembler
    tokens = assembler(n, draft_tokens, y)
    tokens = _checked(assembler, "__call__", "tokens", tokens, (gamma + 1,), "integer")
    return {"num_accepted": n, "tokens": tokens.astype(jnp.int32)}
