"""Stages written the way a research user would: subclasses of the abstract bases, one
(at least) for every base, some with Python fields used in Python control flow."""

import ast
import pathlib
import re
from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

import eqx_specdec


class LenientRatioTest(eqx_specdec.AbstractRatioTest):
    """Accept when `u * l * q(x) < p(x)`; `l = 1` is the standard rule."""

    exact: ClassVar[bool] = False
    lenience: Float[Array, ""] | float = 1.0

    def __call__(
        self, draft_tokens, draft_probs, target_probs, accept_uniforms, context
    ):
        # Written for probabilities: the context converts log-probabilities.
        rows = context.probabilities
        p = jnp.take_along_axis(rows(target_probs[:-1]), draft_tokens[:, None], 1)[:, 0]
        q = jnp.take_along_axis(rows(draft_probs), draft_tokens[:, None], 1)[:, 0]
        lenience = jnp.asarray(self.lenience, p.dtype)
        return eqx_specdec.Verdict(accept_uniforms.astype(p.dtype) * lenience * q < p)


class SwitchedRatioTest(eqx_specdec.AbstractRatioTest):
    """The standard test, with Python fields steering Python control flow: a `str`
    mode, a `bool` flag and an `int` (a tuple of positions to force-reject)."""

    exact: ClassVar[bool] = False  # its forced rejections are lossy
    mode: str = "ratio"  # "ratio": u q < p; "division": u < p / q
    strict: bool = True
    rejected_positions: tuple[int, ...] = ()

    def __call__(
        self,
        draft_tokens,
        draft_probs,
        target_probs,
        accept_uniforms,
        context=eqx_specdec.RowContext(),
    ):
        p, q = context.gather(draft_tokens, draft_probs, target_probs)
        if context.log_space:
            p, q = jnp.exp(p), jnp.exp(q)
        u = accept_uniforms.astype(p.dtype)
        if self.mode == "ratio":
            passed = u * q < p if self.strict else u * q <= p
        elif self.mode == "division":
            passed = u < jnp.where(q > 0, p / jnp.where(q > 0, q, 1), jnp.inf)
        else:
            raise ValueError(self.mode)
        for position in self.rejected_positions:
            passed = passed.at[position].set(False)
        return eqx_specdec.Verdict(passed)


class ArgminPrefixCounter(eqx_specdec.AbstractPrefixCounter):
    """The first failure found with `argmin`, rather than a cumulative product."""

    counts: ClassVar[str] = "first failure"

    def __call__(self, passed: Bool[Array, " G"]) -> Int[Array, ""]:
        first_failure = jnp.argmin(passed).astype(jnp.int32)
        return jnp.where(jnp.all(passed), passed.shape[0], first_failure)


class SearchsortedSampler(eqx_specdec.AbstractResidualSampler):
    """The residual $(c_n p_n - q_n)_+$ (with the verdict's scale $c_n$), normalised,
    searched with `jnp.searchsorted`."""

    draws: ClassVar[str] = "residual"
    randomness: ClassVar[str] = "uniform"

    def __call__(
        self,
        num_accepted,
        verdict,
        draft_tokens,
        draft_probs,
        target_probs,
        sample_uniform,
        context,
    ):
        gamma = draft_tokens.shape[0]
        n = num_accepted
        p = context.probabilities(target_probs[n])
        q = context.probabilities(draft_probs[jnp.minimum(n, gamma - 1)])
        scale = verdict.residual_scale[jnp.minimum(n, gamma - 1)].astype(p.dtype)
        residual = jnp.where(n < gamma, jnp.maximum(scale * p - q, 0), p)
        cdf = jnp.cumsum(residual / residual.sum())
        token = jnp.searchsorted(cdf, sample_uniform.astype(cdf.dtype), side="right")
        return jnp.minimum(token, p.shape[0] - 1).astype(jnp.int32)


class TopKArgmaxSampler(eqx_specdec.AbstractResidualSampler):
    """A deterministic correction through `jax.lax.top_k` with a Python `int` field:
    the most likely of the target's top `k` tokens at row n (the argmax, for any k)."""

    draws: ClassVar[str] = "argmax"
    k: int = 3
    randomness: ClassVar[str] = "none"

    def __call__(
        self,
        num_accepted,
        verdict,
        draft_tokens,
        draft_probs,
        target_probs,
        sample_uniform,
        context,
    ):
        _, ids = jax.lax.top_k(target_probs[num_accepted], self.k)
        return ids[0].astype(jnp.int32)


class ScatterTokenAssembler(eqx_specdec.AbstractTokenAssembler):
    """Writes the output with `.at[].set()` scatters."""

    def __call__(self, num_accepted, draft_tokens, correction):
        gamma = draft_tokens.shape[0]
        position = jnp.arange(gamma, dtype=jnp.int32)
        kept = jnp.where(position < num_accepted, draft_tokens.astype(jnp.int32), -1)
        tokens = jnp.append(kept, jnp.int32(-1))
        return tokens.at[num_accepted].set(correction)


class UserIIDCandidates(eqx_specdec.AbstractNodeRule):
    """SpecInfer's i.i.d. rule written out as a node rule, with its drafting
    capability."""

    exact: ClassVar[bool] = True
    uses_draft_probs: ClassVar[bool] = True

    def ratio(self, state, token, child):
        return state.residual[token], state.mass * state.draft[token]

    def reject(self, state, token, child):
        residual, mass, draft = state.residual, state.mass, state.draft
        new = jnp.maximum(residual - mass * draft, 0)
        new_mass = jnp.sum(new)
        keep = new_mass > jnp.finfo(residual.dtype).tiny
        return eqx_specdec.ResidualState(
            jnp.where(keep, new, residual), jnp.where(keep, new_mass, mass), draft
        )

    def candidate_law(self, draft, drafted):
        return draft


class DraftlessIIDRule(eqx_specdec.AbstractNodeRule):
    """The i.i.d. rule's test and update, without the drafting capability
    (`candidate_law`)."""

    exact: ClassVar[bool] = True
    uses_draft_probs: ClassVar[bool] = True

    def ratio(self, state, token, child):
        return eqx_specdec.IIDCandidates().ratio(state, token, child)

    def reject(self, state, token, child):
        return eqx_specdec.IIDCandidates().reject(state, token, child)


class MappedVerifier(eqx_specdec.AbstractVerifier):
    """A verifier of one's own: the four stages mapped over the rows with `jax.vmap`,
    written without the library's `Verifier`."""

    ratio_test: eqx_specdec.AbstractRatioTest = eqx_specdec.RatioTest()
    prefix_counter: eqx_specdec.AbstractPrefixCounter = eqx_specdec.PrefixCounter()
    residual_sampler: eqx_specdec.AbstractResidualSampler = (
        eqx_specdec.ResidualSampler()
    )
    token_assembler: eqx_specdec.AbstractTokenAssembler = eqx_specdec.TokenAssembler()

    def __call__(self, draft_tokens, draft_probs, target_probs, accept, sample):
        def row(x, q, p, u, s):
            verdict = self.ratio_test(x, q, p, u)
            n = self.prefix_counter(verdict.passed).astype(jnp.int32)
            y = self.residual_sampler(n, verdict, x, q, p, s).astype(jnp.int32)
            tokens = self.token_assembler(n, x, y)
            return {"num_accepted": n, "tokens": tokens.astype(jnp.int32)}

        return jax.vmap(row)(draft_tokens, draft_probs, target_probs, accept, sample)


def page_classes(page: str) -> dict:
    """The classes a docs page's Python blocks define, as a reader's paste defines them
    (each block's imports and class definitions, run in one namespace)."""
    text = (pathlib.Path(__file__).parent.parent / "docs" / page).read_text()
    namespace = {"__name__": page}
    for code in re.findall(r"```python\n(.*?)```", text, re.S):
        kept = [
            node
            for node in ast.parse(code).body
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef))
        ]
        exec(compile(ast.Module(kept, []), page, "exec"), namespace)
    return namespace


# The capped and lenient rules of "Writing a custom stage", as users write them.
_PAGE = page_classes("custom_stage.md")
Capped = _PAGE["Capped"]
MyLenientRatioTest = _PAGE["MyLenientRatioTest"]
