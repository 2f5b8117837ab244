"""The decoding loop's argument checks, made before anything is traced."""

import jax
import jax.numpy as jnp
import numpy as np

from ._abstract_tree_verifier import AbstractTreeVerifier, check_static_depth
from ._abstract_verifier import AbstractVerifier
from ._capabilities import require
from ._tree import check_tree_shape


def check_tree(tree, verifier, drafting) -> tuple[int, ...] | None:
    """Checks `tree` against the verifier: trees need a TreeVerifier whose node rule
    can draft (`candidate_law`), and chains anything else."""
    if tree is None:
        if isinstance(verifier, AbstractTreeVerifier):
            check_tree_shape(
                None, type(verifier).__name__
            )  # raises: a tree verifier needs the tree's shape
        if drafting not in ("sample", "argmax"):
            raise ValueError(
                f'`drafting` must be "sample" (draft tokens x ~ q) or "argmax" (one-hot '
                f"drafts), got {drafting!r}."
            )
        return None
    if not isinstance(verifier, AbstractTreeVerifier):
        raise TypeError(
            "`tree` is given, so `verifier` must be a tree verifier (TreeVerifier or "
            "TraversalVerifier, an eqx_specdec.AbstractTreeVerifier); got "
            f"{type(verifier).__name__}."
        )
    if drafting != "sample":
        raise ValueError(
            "`drafting` is for chains; a tree's children are drafted by its node rule's "
            "`candidate_law`. Subclass the node rule to change how they are drawn."
        )
    rule = verifier.drafting_rule()
    require(rule, "candidate_law", "drafting a tree in the decoding loop")
    tree = check_tree_shape(tree)
    check_static_depth(verifier, tree)
    return tree


def check_decode_arguments(
    prompt_tokens, prompt_lengths, num_tokens, gamma, outputs, verifier
):
    if not isinstance(verifier, (AbstractVerifier, AbstractTreeVerifier)):
        raise TypeError(
            "`verifier` must be an eqx_specdec.Verifier (or ShardedVerifier, or "
            f"TreeVerifier with `tree`), got {type(verifier).__name__}."
        )
    for name, value, low in (("num_tokens", num_tokens, 1), ("gamma", gamma, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"`{name}` must be a Python int >= {low}, got {value!r}.")
    if outputs not in ("probs", "logits"):
        raise ValueError(f'`outputs` must be "probs" or "logits", got {outputs!r}.')
    if jnp.ndim(prompt_tokens) != 2:
        raise ValueError(
            "`prompt_tokens` must have shape (B, P): one row per sequence, padded to "
            f"a common width; got shape {jnp.shape(prompt_tokens)}."
        )
    if not jnp.issubdtype(jnp.result_type(prompt_tokens), jnp.integer):
        raise TypeError(
            f"`prompt_tokens` must be integer token ids, got {jnp.result_type(prompt_tokens)}."
        )
    batch, width = jnp.shape(prompt_tokens)
    if prompt_lengths is None:
        return jnp.full((batch,), width, jnp.int32)
    if jnp.shape(prompt_lengths) != (batch,):
        raise ValueError(
            f"`prompt_lengths` must have shape (B,) = ({batch},), got "
            f"{jnp.shape(prompt_lengths)}."
        )
    try:
        lengths = np.asarray(prompt_lengths)
    except jax.errors.TracerArrayConversionError:
        lengths = None  # traced: checked by the caller's own program, if at all
    if lengths is not None:
        if lengths.min(initial=1) < 1 or lengths.max(initial=1) > width:
            raise ValueError(
                f"`prompt_lengths` must lie in [1, {width}] (each prompt holds at least "
                f"one token and fits its row of `prompt_tokens`); got {lengths.tolist()}."
            )
    return jnp.asarray(prompt_lengths, jnp.int32)
