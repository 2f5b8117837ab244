"""Verification on inputs sharded across devices: over the batch (data parallel), over the
vocabulary (tensor-parallel LM heads), or both, with `jax.shard_map`. Vocabulary shards
exchange per-row scalars and per-shard partial sums only, never a row of p or q."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Int

from ._custom_types import (
    AcceptUniforms,
    DraftProbs,
    DraftTokens,
    SampleRandomnessBatch,
    TargetProbs,
)
from ._misc import compute_dtype
from ._stages.assemblers import AbstractTokenAssembler
from ._stages.prefix_counters import AbstractPrefixCounter
from ._stages.ratio_tests import (
    _ratio_test,
    AbstractRatioTest,
    block_cumulative,
    block_h,
    BlockRatioTest,
    GreedyRatioTest,
    LenientRatioTest,
    RatioTest,
)
from ._stages.samplers import (
    AbstractResidualSampler,
    ArgmaxSampler,
    guarded_search,
    has_mass,
    inverse_cdf,
    ResidualSampler,
)
from ._stages.verdict import Verdict
from ._verifier import Verifier


_VOCAB_RATIO_TESTS = (RatioTest, LenientRatioTest, GreedyRatioTest, BlockRatioTest)
_VOCAB_SAMPLERS = (ResidualSampler, ArgmaxSampler)


def _vocab_sharding_problem(verifier: Verifier) -> str | None:
    """Why `verifier` cannot run on vocabulary-sharded inputs, or None."""
    for stage, supported in (
        (verifier.ratio_test, _VOCAB_RATIO_TESTS),
        (verifier.residual_sampler, _VOCAB_SAMPLERS),
    ):
        names = ", ".join(c.__name__ for c in supported)
        if type(stage) not in supported:
            return (
                f"{type(stage).__name__} has no vocabulary-parallel form: a sharded "
                f"stage must say which per-shard partial results to exchange, and only "
                f"{names} do. Shard over the batch only (`vocab_axis=None`), where every "
                "stage runs unchanged."
            )
        if getattr(stage, "log_space", False):
            return (
                f"{type(stage).__name__}(log_space=True) has no vocabulary-parallel "
                "form; pass probabilities (log_space=False)."
            )
    return None


def _axis_size(mesh: Mesh, axes) -> int:
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh.shape[a] for a in axes)


class ShardedVerifier(eqx.Module):
    """A [`eqx_specdec.Verifier`][] that runs on inputs sharded across the devices of a
    mesh, with `jax.shard_map`: over the batch (`batch_axis`), over the vocabulary
    (`vocab_axis`), or both.

    - **Batch only**: each device verifies its own rows with the wrapped verifier,
        unchanged (any stages, user stages included). Nothing crosses devices.
    - **Vocabulary**: each device holds a contiguous slice of every row of $p$ and $q$.
        The standard stages run in a vocabulary-parallel form that never gathers a row:
        the shard that owns $x_i$ contributes $p_i(x_i)$ and $q_i(x_i)$ (a `psum` of one
        value per position), each shard sums its part of the residual of row $n$ (an
        `all_gather` of one scalar per shard), every device finds the shard that holds
        the threshold $s \\cdot \\text{total}$, and that shard alone searches its slice;
        the token comes back in one more `psum`. Per row, $O(G + D)$ scalars cross the
        devices, against $O(GV)$ for gathering the rows.

    Vocabulary sharding supports [`eqx_specdec.RatioTest`][],
    [`eqx_specdec.LenientRatioTest`][], [`eqx_specdec.GreedyRatioTest`][] and
    [`eqx_specdec.BlockRatioTest`][] (its lookahead masses $Z_k$ are per-shard partial
    sums), with [`eqx_specdec.ResidualSampler`][] or [`eqx_specdec.ArgmaxSampler`][],
    on probabilities, with sampled or one-hot drafts, and any prefix counter and token
    assembler (they see per-row values only). Other stages raise a `TypeError` at
    construction.

    The tokens equal the single-device verifier's, except where the sampling uniform
    $s$ falls within float rounding of a boundary of the residual's CDF (or $u_i$ of
    block verification's $h_i$): the shards sum the residual in a different order, so the
    totals can differ in the last bit (see the Scaling out page).

    **Arguments:**

    - `verifier`: the [`eqx_specdec.Verifier`][] to run.
    - `mesh`: a `jax.sharding.Mesh`.
    - `batch_axis`: the mesh axis (or tuple of axes) the batch is split over, or `None`.
    - `vocab_axis`: the mesh axis the vocabulary is split over, or `None`.
    """

    verifier: Verifier
    mesh: Mesh = eqx.field(static=True)
    batch_axis: str | tuple[str, ...] | None = eqx.field(static=True, default=None)
    vocab_axis: str | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        if not isinstance(self.verifier, Verifier):
            raise TypeError(
                "ShardedVerifier(`verifier`=...) must be an eqx_specdec.Verifier, got "
                f"{type(self.verifier).__name__}."
            )
        if not isinstance(self.mesh, Mesh):
            raise TypeError(
                "ShardedVerifier(`mesh`=...) must be a jax.sharding.Mesh (for example "
                f"`jax.make_mesh((2, 4), ('batch', 'vocab'))`), got {type(self.mesh).__name__}."
            )
        batch = () if self.batch_axis is None else self.batch_axis
        batch = (batch,) if isinstance(batch, str) else tuple(batch)
        vocab = () if self.vocab_axis is None else (self.vocab_axis,)
        for name, axes in (("batch_axis", batch), ("vocab_axis", vocab)):
            for axis in axes:
                if axis not in self.mesh.axis_names:
                    raise ValueError(
                        f"ShardedVerifier(`{name}`={axis!r}): the mesh has axes "
                        f"{tuple(self.mesh.axis_names)}."
                    )
        if set(batch) & set(vocab):
            raise ValueError(
                "ShardedVerifier: `batch_axis` and `vocab_axis` must be different axes."
            )
        if self.vocab_axis is not None:
            problem = _vocab_sharding_problem(self.verifier)
            if problem is not None:
                raise TypeError(
                    f"ShardedVerifier(vocab_axis={self.vocab_axis!r}): {problem}"
                )

    # The stages, so that the entry points see this as the verifier it wraps.
    @property
    def ratio_test(self) -> AbstractRatioTest:
        return self.verifier.ratio_test

    @property
    def prefix_counter(self) -> AbstractPrefixCounter:
        return self.verifier.prefix_counter

    @property
    def residual_sampler(self) -> AbstractResidualSampler:
        return self.verifier.residual_sampler

    @property
    def token_assembler(self) -> AbstractTokenAssembler:
        return self.verifier.token_assembler

    def __call__(
        self,
        draft_tokens: DraftTokens,
        draft_probs: DraftProbs | None,
        target_probs: TargetProbs,
        accept_uniforms: AcceptUniforms,
        sample_uniforms: SampleRandomnessBatch,
    ) -> dict[str, Int[Array, "..."]]:
        """Verifies a sharded batch. Arguments and return value as for
        [`eqx_specdec.Verifier.__call__`][]; `B` must divide evenly over `batch_axis` and
        `V` over `vocab_axis`. Inputs not yet laid out that way are resharded first."""
        batch, vocab = target_probs.shape[0], target_probs.shape[-1]
        for what, size, axes in (
            ("batch B", batch, self.batch_axis),
            ("vocabulary V", vocab, self.vocab_axis),
        ):
            devices = _axis_size(self.mesh, axes)
            if size % devices:
                raise ValueError(
                    f"ShardedVerifier: the {what} = {size} does not split evenly over "
                    f"the {devices} devices of mesh axis {axes!r}; pad it to a multiple "
                    f"of {devices}."
                )
        b, v = self.batch_axis, self.vocab_axis
        specs = {
            "draft_tokens": PartitionSpec(b, None),
            "draft_probs": PartitionSpec(b, None, v),
            "target_probs": PartitionSpec(b, None, v),
            "accept_uniforms": PartitionSpec(b, None),
            "sample_uniforms": PartitionSpec(b),
        }
        inputs = {
            "draft_tokens": draft_tokens,
            "draft_probs": draft_probs,
            "target_probs": target_probs,
            "accept_uniforms": accept_uniforms,
            "sample_uniforms": sample_uniforms,
        }
        if draft_probs is None:
            del specs["draft_probs"], inputs["draft_probs"]
        if v is None:

            def body(local):
                return self.verifier(
                    local["draft_tokens"],
                    local.get("draft_probs"),
                    local["target_probs"],
                    local["accept_uniforms"],
                    local["sample_uniforms"],
                )
        else:

            def body(local):
                return _vocab_parallel(self.verifier, v, local)

        out_specs = {
            "num_accepted": PartitionSpec(b),
            "tokens": PartitionSpec(b, None),
        }
        explicit = any(t == AxisType.Explicit for t in self.mesh.axis_types)
        if explicit:
            # Explicit axes: lay the inputs out as the specs say (a no-op when they
            # already are); shard_map does not reshard explicitly typed arrays itself.
            inputs = {
                k: jax.reshard(x, NamedSharding(self.mesh, specs[k]))
                for k, x in inputs.items()
            }
        outputs = jax.shard_map(
            body, mesh=self.mesh, in_specs=(specs,), out_specs=out_specs
        )(inputs)
        if explicit:
            # Hand the outputs back laid out over the batch as the draft tokens came.
            batch_spec = jax.typeof(draft_tokens).sharding.spec
            batch_spec = batch_spec[0] if len(batch_spec) else None
            outputs = {
                "num_accepted": jax.reshard(
                    outputs["num_accepted"],
                    NamedSharding(self.mesh, PartitionSpec(batch_spec)),
                ),
                "tokens": jax.reshard(
                    outputs["tokens"],
                    NamedSharding(self.mesh, PartitionSpec(batch_spec, None)),
                ),
            }
        return outputs


def _global_argmax(values, axis_name, offset):
    """The argmax over the last axis of values sharded over `axis_name` (lowest id on
    ties, as `jnp.argmax` on the whole row): a `pmax` of the shard maxima, then a `pmin`
    of the ids that reach it. Two scalars per row cross the devices, not the rows."""
    local_best = jnp.max(values, axis=-1)
    local_id = jnp.argmax(values, axis=-1).astype(jnp.int32) + offset
    best = jax.lax.pmax(local_best, axis_name)
    big = jnp.iinfo(jnp.int32).max
    return jax.lax.pmin(jnp.where(local_best == best, local_id, big), axis_name)


def _vocab_parallel(verifier: Verifier, axis: str, local: dict) -> dict:
    """The vocabulary-parallel pipeline on one device's block: rows `(b,)`, vocabulary
    slice `[offset, offset + v)`."""
    tokens = local["draft_tokens"].astype(jnp.int32)
    draft, target = local.get("draft_probs"), local["target_probs"]
    accept, sample = local["accept_uniforms"], local["sample_uniforms"]
    gamma, width = tokens.shape[1], target.shape[-1]
    shard = jax.lax.axis_index(axis).astype(jnp.int32)
    offset = shard * width
    dtypes = [target.dtype] + ([] if draft is None else [draft.dtype])
    dtype = compute_dtype(*dtypes)

    # p_i(x_i), q_i(x_i): one nonzero term per psum, so exact.
    local_ids = tokens - offset
    owned = (local_ids >= 0) & (local_ids < width)
    index = jnp.clip(local_ids, 0, width - 1)[..., None]

    def gather(x):
        values = jnp.take_along_axis(x[:, :gamma], index, axis=-1)[..., 0]
        return jax.lax.psum(jnp.where(owned, values.astype(dtype), 0), axis)

    p_x = gather(target)
    q_x = jnp.ones_like(p_x) if draft is None else gather(draft)

    test = verifier.ratio_test
    if isinstance(test, GreedyRatioTest):
        best = _global_argmax(target[:, :gamma], axis, offset)
        verdicts = jax.vmap(Verdict)(best == tokens)
    elif isinstance(test, BlockRatioTest):
        if draft is None:
            raise ValueError(
                "BlockRatioTest needs `draft_probs`: block verification uses the whole "
                "draft distributions q_k, which one-hot drafts do not have."
            )
        cum = jax.vmap(block_cumulative, in_axes=(0, 0, None))(p_x, q_x, False)
        rows = slice(1, gamma)
        partial = jnp.sum(
            jnp.maximum(
                cum[:, rows, None] * target[:, rows].astype(dtype)
                - draft[:, rows].astype(dtype),
                0,
            ),
            axis=-1,
        )
        h = jax.vmap(block_h)(cum, jax.lax.psum(partial, axis))
        verdicts = jax.vmap(Verdict)(accept.astype(h.dtype) < h, cum[:, :-1])
    else:
        lenience = test.lenience if isinstance(test, LenientRatioTest) else None
        passed = jax.vmap(_ratio_test, in_axes=(0, 0, 0, None, None))(
            p_x, q_x, accept, lenience, False
        )
        verdicts = jax.vmap(Verdict)(passed)
    n = jax.vmap(verifier.prefix_counter)(verdicts.passed).astype(jnp.int32)

    rows = jnp.arange(tokens.shape[0])
    p_n = target[rows, n]  # (b, v): this shard's part of row n
    if isinstance(verifier.residual_sampler, ArgmaxSampler):
        y = _global_argmax(p_n, axis, offset)
    else:
        y = _sharded_residual_draw(
            verifier, axis, shard, offset, n, verdicts, tokens, draft, p_n, sample
        )
    out = jax.vmap(verifier.token_assembler)(n, tokens, y)
    return {"num_accepted": n, "tokens": out.astype(jnp.int32)}


def _sharded_residual_draw(
    verifier, axis, shard, offset, n, verdicts, tokens, draft, p_n, sample
):
    """The standard residual draw with the vocabulary split over `axis`."""
    gamma, width = tokens.shape[1], p_n.shape[-1]
    rows = jnp.arange(tokens.shape[0])
    dtypes = [p_n.dtype, verdicts.residual_scale.dtype]
    if draft is not None:
        dtypes.append(draft.dtype)
    dtype = compute_dtype(*dtypes)
    rejected = n < gamma
    at = jnp.minimum(n, gamma - 1)
    p_part = p_n.astype(dtype)
    if draft is None:  # one-hot drafts
        ids = offset + jnp.arange(width, dtype=jnp.int32)
        q_part = (ids[None] == tokens[rows, at][:, None]).astype(dtype)
    else:
        q_part = draft[rows, at].astype(dtype)
    scale = verdicts.residual_scale[rows, at].astype(dtype)
    residual = jnp.maximum(scale[:, None] * p_part - q_part, 0)
    weights = jnp.where(rejected[:, None], residual, p_part)
    # One scalar per shard and row crosses the devices: the shard's mass of the residual
    # (or of p_n, for the bonus token and the zero-mass fallback).
    masses = jax.lax.all_gather(
        jnp.stack([jnp.sum(weights, -1), jnp.sum(p_part, -1)]), axis
    )  # (D, 2, b)
    use_residual = rejected & has_mass(jnp.sum(masses[:, 0], 0), dtype)
    shard_masses = jnp.where(use_residual[None], masses[:, 0], masses[:, 1])  # (D, b)
    weights = jnp.where(use_residual[:, None], weights, p_part)

    def owner(masses, uniform):
        """The shard holding uniform * total, with the one-device search's guards."""
        cumulative = jnp.cumsum(masses)
        threshold = uniform.astype(masses.dtype) * cumulative[-1]
        which = guarded_search(cumulative, masses > 0, threshold)
        before = jnp.where(which > 0, cumulative[jnp.maximum(which - 1, 0)], 0)
        return which, threshold - before

    which, local_threshold = jax.vmap(owner, in_axes=(1, 0))(shard_masses, sample)
    local = jax.vmap(lambda w, t: inverse_cdf(w, None, t))(weights, local_threshold)
    mine = which == shard
    return jax.lax.psum(jnp.where(mine, offset + local, 0), axis)
