"""Per-position allowed-token masks (structured output): the target's rows, and the
draft's where it sampled under the mask, restricted to each position's allowed tokens."""

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .results import Problem, RESULTS


def allowed_tokens(allowed, shape: tuple[int, int, int]) -> Bool[Array, "B rows V"]:
    """`allowed` as booleans of `shape` `(B, G + 1, V)`: given as booleans, or packed
    in uint32 words `(B, G + 1, ceil(V / 32))` (token `v` is bit `v % 32` of word
    `v // 32`, least significant bit first). An error names `allowed` otherwise."""
    allowed = jnp.asarray(allowed)
    batch, rows, vocab = shape
    if allowed.dtype == jnp.bool_:
        if allowed.shape != shape:
            raise ValueError(
                f"`allowed` must have shape (B, G + 1, V) = {shape} (booleans), or "
                f"(B, G + 1, ceil(V / 32)) = {(batch, rows, -(-vocab // 32))} (uint32 "
                f"bits); got {allowed.shape}."
            )
        return allowed
    words = -(-vocab // 32)
    if allowed.dtype != jnp.uint32 or allowed.shape != (batch, rows, words):
        raise ValueError(
            f"`allowed` must be booleans of shape (B, G + 1, V) = {shape}, or uint32 "
            f"words of shape (B, G + 1, ceil(V / 32)) = {(batch, rows, words)}; got "
            f"{allowed.dtype} of shape {allowed.shape}."
        )
    bits = jnp.arange(32, dtype=jnp.uint32).reshape((1,) * allowed.ndim + (32,))
    unpacked = (allowed[..., None] >> bits) & jnp.uint32(1)
    return unpacked.reshape(batch, rows, words * 32)[..., :vocab].astype(bool)


def masked_probs(
    probs: Float[Array, "B rows V"], allowed: Bool[Array, "B rows V"]
) -> Float[Array, "B rows V"]:
    """Each row restricted to its allowed tokens and renormalised (a row without mass
    there stays zero: the checks report it)."""
    kept = jnp.where(allowed, probs, jnp.zeros((), probs.dtype))
    total = jnp.sum(kept, axis=-1, keepdims=True)
    return kept / jnp.where(total > 0, total, jnp.ones((), total.dtype))


def masked_logits(
    logits: Float[Array, "B rows V"], allowed: Bool[Array, "B rows V"]
) -> Float[Array, "B rows V"]:
    """Each row's disallowed tokens at $-\\infty$."""
    return jnp.where(allowed, logits, jnp.asarray(-jnp.inf, logits.dtype))


def mask_problems(allowed, masked_target, log_space: bool):
    """Per-row flags `(B,)`: a position with no allowed token, or a target that gives
    its allowed tokens no probability."""
    empty = ~jnp.any(allowed, axis=-1)
    if log_space:
        no_mass = jnp.max(masked_target, axis=-1) == -jnp.inf
    else:
        no_mass = jnp.sum(masked_target, axis=-1) <= 0
    return [
        Problem(
            jnp.any(empty, axis=-1),
            RESULTS.invalid_mask,
            "`allowed` has a position with no allowed token in row {row} (the first "
            "such row). Allow at least one token at every position.",
        ),
        Problem(
            jnp.any(no_mass & ~empty, axis=-1),
            RESULTS.invalid_mask,
            "The target gives no probability to any token `allowed` permits at some "
            "position of row {row} (the first such row). Check the mask against the "
            "target's vocabulary.",
        ),
    ]
