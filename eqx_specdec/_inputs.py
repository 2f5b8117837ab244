"""What every entry point does with its inputs before verifying: convert, check shapes
and dtypes at trace time, fill in unused randomness, and list the run-time checks."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from ._checks import (
    distribution_problems,
    logit_problems,
    raise_deferred_problem,
    token_problems,
    uniform_problems,
)


def _shape(x) -> str:
    return "(" + ", ".join(str(d) for d in x.shape) + ")"


def _is_key(x) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


class PreparedInputs(eqx.Module):
    """Validated inputs, in the order `Verifier.__call__` takes them."""

    arrays: tuple
    distribution_names: tuple[str, str] = eqx.field(static=True)
    log_space: bool = eqx.field(static=True)
    check_accept: bool = eqx.field(static=True)
    check_sample: bool = eqx.field(static=True)

    def value_problems(self) -> list:
        draft_tokens, draft, target, accept, sample = self.arrays
        problems_of = logit_problems if self.log_space else distribution_problems
        problems = token_problems(draft_tokens, target.shape[-1])
        draft_name, target_name = self.distribution_names
        if draft is not None:
            problems += problems_of(draft_name, draft)
        problems += problems_of(target_name, target)
        if self.check_accept:
            problems += uniform_problems("accept_uniforms", accept)
        if self.check_sample:
            problems += uniform_problems("sample_uniforms", sample)
        return problems


def _check_stage_spaces(entry_point, verifier, log_space):
    for name in ("ratio_test", "residual_sampler"):
        stage = getattr(verifier, name)
        stage_log_space = getattr(stage, "log_space", None)
        if stage_log_space is not None and stage_log_space != log_space:
            reads = "log-probabilities" if log_space else "probabilities"
            raise TypeError(
                f"{entry_point} passes {reads} to the verifier, but its `{name}` "
                f"{type(stage).__name__} has log_space={stage_log_space}. Build it with "
                f"{type(stage).__name__}(log_space={log_space})."
            )


def _validate(arrays, names):
    """Trace-time checks of ranks, shapes and dtypes, with messages naming the argument."""
    layouts = ["(B, G)", "(B, G, V)", "(B, G+1, V)", "(B, G)", "(B,)"]
    ranks = [2, 3, 3, 2, 1]
    for x, name, rank, layout in zip(arrays, names, ranks, layouts):
        if x is not None and x.ndim != rank:
            raise ValueError(
                f"`{name}` must have rank {rank}, shape {layout}; got shape {_shape(x)}."
            )
    for i, (x, name) in enumerate(zip(arrays, names)):
        if x is None or (i == 4 and _is_key(x)):
            continue
        if i == 0:
            if not jnp.issubdtype(x.dtype, jnp.integer):
                raise TypeError(
                    f"`{name}` must have an integer dtype (token ids), got "
                    f"{x.dtype}. Cast with `.astype(jnp.int32)`."
                )
        elif not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(
                f"`{name}` must have a floating dtype (float16, bfloat16, float32 or "
                f"float64), got {x.dtype}."
            )
    draft_tokens, _, target = arrays[:3]
    batch, gamma = draft_tokens.shape
    vocab = target.shape[2]
    if gamma < 1:
        raise ValueError(
            f"`{names[0]}` must hold at least one draft token per row; got shape "
            f"{_shape(draft_tokens)}."
        )
    if vocab < 1:
        raise ValueError(f"`{names[2]}` has an empty vocabulary: {_shape(target)}.")
    expected = [None, (batch, gamma, vocab), (batch, gamma + 1, vocab), (batch, gamma)]
    expected.append((batch,))
    for x, name, shape, layout in zip(arrays, names, expected, layouts):
        if x is None or shape is None or tuple(x.shape) == shape:
            continue
        why = f" (one row more than `{names[1]}`, for the bonus token)"
        raise ValueError(
            f"`{name}` must have shape {layout} = {shape} to match `{names[0]}` "
            f"{_shape(draft_tokens)} and `{names[2]}` vocabulary {vocab}"
            f"{why if name == names[2] else ''}; got {_shape(x)}."
        )


def prepare_inputs(
    entry_point: str,
    verifier,
    check_inputs,
    arrays: tuple,
    *,
    log_space: bool,
    names=(
        "draft_tokens",
        "draft_probs",
        "target_probs",
        "accept_uniforms",
        "sample_uniforms",
    ),
) -> PreparedInputs:
    from ._sharding import ShardedVerifier
    from ._verifier import Verifier

    if not isinstance(verifier, (Verifier, ShardedVerifier)):
        raise TypeError(
            "`verifier` must be an eqx_specdec.Verifier (or ShardedVerifier), got "
            f"{type(verifier).__name__}."
        )
    _check_stage_spaces(entry_point, verifier, log_space)
    arrays = tuple(None if x is None else jnp.asarray(x) for x in arrays)
    draft_tokens, draft, target, accept, sample = arrays
    if target is None:
        raise TypeError(f"`{names[2]}` is required.")
    _validate(arrays, names)
    batch, gamma = draft_tokens.shape

    ratio_test, sampler = verifier.ratio_test, verifier.residual_sampler
    check_accept = accept is not None
    if accept is None:
        if ratio_test.uses_uniforms:
            raise TypeError(
                f"`accept_uniforms` is None, but {type(ratio_test).__name__} draws "
                f"uniforms: pass a float array of shape (B, G) = {(batch, gamma)}."
            )
        accept = jnp.zeros((batch, gamma), jnp.float32)
    check_sample = sample is not None and not _is_key(sample)
    if sampler.randomness == "key":
        if sample is None or not _is_key(sample):
            raise TypeError(
                f"{type(sampler).__name__} draws from one `jax.random` key per row: pass "
                f"`sample_uniforms=jax.random.split(key, {batch})`, or call "
                "`speculative_accept_from_key`."
            )
        check_sample = False
    elif sample is None:
        if sampler.randomness != "none":
            raise TypeError(
                f"`sample_uniforms` is None, but {type(sampler).__name__} draws a "
                f"uniform per row: pass a float array of shape (B,) = ({batch},)."
            )
        sample = jnp.zeros((batch,), jnp.float32)
    elif _is_key(sample):
        raise TypeError(
            f"`sample_uniforms` holds `jax.random` keys, but {type(sampler).__name__} "
            "takes a float uniform per row."
        )
    return PreparedInputs(
        (draft_tokens, draft, target, accept, sample),
        (names[1], names[2]),
        log_space,
        check_accept,
        check_sample,
    )


def is_sharded(verifier) -> bool:
    """Whether `verifier` runs over several devices (its value checks are deferred)."""
    from ._sharding import ShardedVerifier

    return isinstance(verifier, ShardedVerifier)


def jit_entry_point(fn):
    """Compiles an entry point with `jax.jit`, `check_inputs` static.

    A deferred value check (a sharded verifier's) raises after the compiled call.
    A plain Python check of `check_inputs` runs first, so that a traced value (the entry
    point called inside a user's `jax.jit` with `check_inputs` as an argument) gets a
    message saying how to fix it rather than JAX's error about unhashable arguments.
    """
    # One compiled function per value of the flag, so that calls pass arrays only and
    # take JAX's fast dispatch path.
    jitted = {
        flag: jax.jit(functools.partial(fn, check_inputs=flag))
        for flag in (True, False)
    }

    @functools.wraps(fn)
    def entry_point(*args, check_inputs: bool = True, **kwargs):
        if not isinstance(check_inputs, bool):
            raise TypeError(
                "`check_inputs` must be a Python bool, got "
                f"{type(check_inputs).__name__}. Under `jax.jit`, mark it static: "
                f'`jax.jit({fn.__name__}, static_argnames="check_inputs")`.'
            )
        return raise_deferred_problem(jitted[check_inputs](*args, **kwargs))

    return entry_point
