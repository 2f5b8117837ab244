"""The typed inputs of [`eqx_specdec.verify`][]: what an array is (probabilities, or
logits with their warp), the draft (its tokens, its distribution, its tree), and the
randomness."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Integer, Key

from .._misc import no_type_check
from .._warps.warp import Warp


def as_array(value):
    """An array for an array-like (a list, a NumPy array, a scalar), tracers and JAX
    arrays as they are, `None` as it is. A NumPy array is copied (in the dtype
    `jnp.asarray` gives it) and the copy put on the device: `jnp.asarray` compiles a
    program for each new shape and dtype, some 30 ms at its first call, and the
    device may share a NumPy array's memory, which its owner may change later."""
    if value is None or isinstance(value, (jax.Array, jax.core.Tracer)):
        return value
    if isinstance(value, np.ndarray):
        dtype = jax.dtypes.canonicalize_dtype(value.dtype)
        return jax.device_put(np.array(value, dtype))
    return jnp.asarray(value)


class Probabilities(eqx.Module):
    """Distributions given as probabilities: each row over the vocabulary is
    non-negative and sums to 1.

    **Arguments:**

    - `probs`: float, `(B, G + 1, V)` for a target (chains), `(B, G, V)` for a draft, or
        `(B, N + 1, V)` per context of a tree.
    """

    probs: Float[Array, "B L V"] = eqx.field(converter=as_array)


@no_type_check  # its warp is checked by `__check_init__`
class Logits(eqx.Module):
    """Distributions given as logits, with the [`eqx_specdec.Warp`][] that turns them
    into the distribution sampled from (temperature, top-k, top-p, min-p, penalties,
    a logit bias). Log-probabilities are logits whose warp is the identity (the
    default `Warp()`).

    **Arguments:**

    - `logits`: float, shaped as for [`eqx_specdec.Probabilities`][]. $-\\infty$ masks
        a token.
    - `warp`: the [`eqx_specdec.Warp`][]. Default `Warp()` (temperature 1, no
        truncation).
    """

    logits: Float[Array, "B L V"] = eqx.field(converter=as_array)
    warp: Warp = Warp()

    def __check_init__(self):
        if not isinstance(self.warp, Warp):
            raise TypeError(
                "Logits(`warp`=...) must be an eqx_specdec.Warp (for example "
                f"`Warp(temperature=0.7, top_k=50)`), got {type(self.warp).__name__}."
            )


@no_type_check  # its fields are checked by `__check_init__`
class Draft(eqx.Module):
    """What the draft proposed: its tokens, the distribution they were sampled from, and
    for a tree, its shape.

    **Arguments:**

    - `tokens`: integer `(B, G)`, the draft tokens of a chain, or `(B, N)`, the token
        at each node of a tree.
    - `distribution`: a [`eqx_specdec.Probabilities`][] or [`eqx_specdec.Logits`][],
        the law the tokens were drawn from ($q$; `(B, G, V)` for a chain, `(B, N + 1, V)`
        per context of a tree), or `None` for one-hot drafts (n-gram, prompt-lookup and
        argmax drafters; for trees, deterministic children). Default `None`.
    - `parents`: for a tree verifier, integer `(B, N)`, each node's parent in
        depth-first order (-1 for a child of the root, below -1 for padding), or `None`
        for the verifier's own `tree`. Must be `None` for a chain. Default `None`.
    """

    tokens: Integer[Array, "B G"] = eqx.field(converter=as_array)
    distribution: Probabilities | Logits | None = None
    parents: Integer[Array, "B N"] | None = eqx.field(default=None, converter=as_array)

    def __check_init__(self):
        if self.distribution is not None and not isinstance(
            self.distribution, (Probabilities, Logits)
        ):
            raise TypeError(
                "Draft(`distribution`=...) must be an eqx_specdec.Probabilities, an "
                "eqx_specdec.Logits or None (one-hot drafts); got "
                f"{type(self.distribution).__name__}. Wrap the array: "
                "`Draft(tokens, Probabilities(q))`."
            )


class Uniforms(eqx.Module):
    """The randomness of one step, given as uniforms (see the contract).

    **Arguments:**

    - `accept`: float `(B, G)` (one per node of a tree, `(B, N)`), the uniforms
        $u_i \\in [0, 1)$ of the ratio test; `None` for a test that draws none (greedy,
        typical). Default `None`.
    - `sample`: float `(B,)`, the uniforms $s \\in [0, 1)$ of the correction; a
        `jax.random` key array `(B,)` for a key-driven sampler
        ([`eqx_specdec.GumbelSampler`][]); `None` for a deterministic one
        ([`eqx_specdec.ArgmaxSampler`][]). Default `None`.
    """

    accept: Float[ArrayLike, "B G"] | None = eqx.field(default=None, converter=as_array)
    sample: Float[ArrayLike, " B"] | Key[Array, " B"] | None = eqx.field(
        default=None, converter=as_array
    )

    @classmethod
    def from_key(
        cls, key: Key[Array, ""], batch: int, width: int, *, verifier=None
    ) -> "Uniforms":
        """The uniforms [`eqx_specdec.verify`][] draws when its randomness is a
        `jax.random` key.

        Row $b$ uses only `row_key = jax.random.fold_in(key, b)`, so its randomness
        depends neither on the batch size nor on the other rows. From it,
        `accept_key, sample_key = jax.random.split(row_key)`;
        `accept[b] = jax.random.uniform(accept_key, (width,), jnp.float32)`; and
        `sample[b]` is `jax.random.uniform(sample_key, (), jnp.float32)`, or
        `sample_key` itself for a key-driven sampler
        ([`eqx_specdec.GumbelSampler`][]).

        **Arguments:**

        - `key`: a `jax.random` key (typed, from `jax.random.key`).
        - `batch`: the number of rows $B$.
        - `width`: the draft length $G$ of a chain, or the number of nodes $N$ of a
            tree.
        - `verifier`: the chain verifier the randomness is for, when its sampler may
            take a key (its `residual_sampler.randomness` decides between a uniform
            and a key per row). Default `None`: a uniform per row.

        **Returns:**

        The [`eqx_specdec.Uniforms`][]: `accept` float32 `(B, width)`, `sample`
        float32 `(B,)` or a key array `(B,)`.
        """
        sampler = getattr(verifier, "residual_sampler", None)
        key_per_row = getattr(sampler, "randomness", None) == "key"
        row_keys = jax.vmap(lambda b: jax.random.fold_in(key, b))(
            jnp.arange(batch, dtype=jnp.uint32)
        )
        split = jax.vmap(jax.random.split)(row_keys)
        accept_keys, sample_keys = split[:, 0], split[:, 1]
        accept = jax.vmap(lambda k: jax.random.uniform(k, (width,), jnp.float32))(
            accept_keys
        )
        if key_per_row:
            return cls(accept, sample_keys)
        sample = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(sample_keys)
        return cls(accept, sample)
