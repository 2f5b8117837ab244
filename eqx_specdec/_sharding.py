"""Verification on inputs sharded across devices: over the batch (data parallel), over the
vocabulary (tensor-parallel LM heads), or both, with `jax.shard_map`. Vocabulary shards
exchange per-row scalars and per-shard partial sums only, never a row of p or q."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Int

from ._capabilities import require
from ._chain.abstract_verifier import AbstractVerifier, RowReport, verify_row
from ._chain.inputs import StepArguments
from ._chain.verifier import Verifier
from ._custom_types import (
    AcceptUniforms,
    DraftProbs,
    DraftTokens,
    SampleRandomnessBatch,
    TargetProbs,
)
from ._misc import no_type_check
from ._stages.prefix_counter import AbstractPrefixCounter
from ._stages.ratio_test import AbstractRatioTest
from ._stages.residual_sampler import AbstractResidualSampler
from ._stages.row_context import RowContext
from ._stages.row_fields import per_row_values
from ._stages.token_assembler import AbstractTokenAssembler
from ._stages.vocab_shard import VocabShard


def _check_vocab_parallel(verifier: Verifier):
    """Every stage that reads the vocabulary must have a vocabulary-parallel form (the
    prefix counter and token assembler see per-row values only)."""
    for stage in (verifier.ratio_test, verifier.residual_sampler):
        require(
            stage,
            "vocab_parallel",
            "vocabulary sharding (ShardedVerifier with vocab_axis)",
            "shard over the batch only (vocab_axis=None), where every stage runs "
            "unchanged",
        )


def _axis_size(mesh: Mesh, axes) -> int:
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh.shape[a] for a in axes)


@no_type_check  # its fields are checked by `__check_init__`
class ShardedVerifier(AbstractVerifier):
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

    Vocabulary sharding runs each stage's one `__call__` on its device's slice, given a
    [`eqx_specdec.RowContext`][] holding the [`eqx_specdec.VocabShard`][]: a stage
    whose `__call__` reduces over the vocabulary only through the context's
    reductions declares `vocab_parallel = True`. The library's standard, lenient,
    greedy, synthetic and block tests (block's lookahead masses $Z_k$ are per-shard
    partial sums) and its residual and argmax samplers do, with sampled or one-hot
    drafts, on probabilities or log-probabilities; any prefix counter and token
    assembler work (they see per-row values only). A stage that does not (typical
    acceptance, Gumbel, a user's stage that does not declare it) raises
    [`eqx_specdec.MissingCapabilityError`][] at construction.

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
            _check_vocab_parallel(self.verifier)
        if per_row_values(self.verifier.ratio_test):
            raise ValueError(
                f"ShardedVerifier: the ratio test {type(self.verifier.ratio_test).__name__} "
                "holds per-row field values (a leading batch axis), which are not "
                "sharded with the rows. Give them without the batch axis (shared by the "
                "batch), or verify unsharded."
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
        *,
        log_space: bool = False,
    ) -> dict[str, Int[Array, "..."]]:
        """Verifies a sharded batch. Arguments and return value as for
        [`eqx_specdec.Verifier.__call__`][]; `B` must divide evenly over `batch_axis` and
        `V` over `vocab_axis`. Inputs not yet laid out that way are resharded first."""
        arrays = (draft_tokens, draft_probs, target_probs, accept_uniforms)
        return self._run(
            arrays + (sample_uniforms,),
            report=False,
            values=False,
            log_space=log_space,
        )

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
        """As [`eqx_specdec.Verifier.checked_call`][], on each device's block: every
        check is per row, and over a vocabulary axis the sums of rows n are exchanged as
        two scalars per row."""
        arrays = (draft_tokens, draft_probs, target_probs, accept_uniforms)
        return self._run(
            arrays + (sample_uniforms,),
            report=True,
            values=values,
            log_space=log_space,
        )

    def _run(self, arrays, *, report: bool, values: bool, log_space: bool):
        target_probs = arrays[2]
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
        names = StepArguments._fields
        specs = dict(
            zip(
                names,
                (
                    PartitionSpec(b, None),
                    PartitionSpec(b, None, v),
                    PartitionSpec(b, None, v),
                    PartitionSpec(b, None),
                    PartitionSpec(b),
                ),
            )
        )
        inputs = dict(zip(names, arrays))
        if inputs["draft"] is None:
            del specs["draft"], inputs["draft"]
        if v is None and not report:

            def body(local):
                return self.verifier(
                    *(local.get(name) for name in names), log_space=log_space
                )
        elif v is None:

            def body(local):
                return self.verifier.checked_call(
                    *(local.get(name) for name in names),
                    values=values,
                    log_space=log_space,
                )
        else:

            def body(local):
                return _vocab_parallel(
                    self.verifier, v, local, report, values, log_space
                )

        out_specs = {
            "num_accepted": PartitionSpec(b),
            "tokens": PartitionSpec(b, None),
        }
        if report:
            out_specs = (
                out_specs,
                PartitionSpec(b),
            )  # every leaf of the report is per row
        explicit = any(t == AxisType.Explicit for t in self.mesh.axis_types)
        if explicit:
            # Explicit axes: lay the inputs out as the specs say (a no-op when they
            # already are); shard_map does not reshard explicitly typed arrays itself.
            inputs = {
                k: jax.reshard(x, NamedSharding(self.mesh, specs[k]))
                for k, x in inputs.items()
            }
        results = jax.shard_map(
            body, mesh=self.mesh, in_specs=(specs,), out_specs=out_specs
        )(inputs)
        if explicit:
            # Hand the outputs back laid out over the batch as the draft tokens came.
            batch_spec = jax.typeof(arrays[0]).sharding.spec
            batch_spec = batch_spec[0] if len(batch_spec) else None

            def relaid(x):
                spec = PartitionSpec(batch_spec, *([None] * (x.ndim - 1)))
                return jax.reshard(x, NamedSharding(self.mesh, spec))

            results = jax.tree.map(relaid, results)
        return results


def _vocab_parallel(
    verifier: Verifier,
    axis: str,
    local: dict,
    report: bool,
    values: bool,
    log_space: bool,
):
    """The vocabulary-parallel pipeline on one device's block: rows `(b,)`, vocabulary
    slice `[offset, offset + width)`; each row through the stages, given a
    [`eqx_specdec.RowContext`][] holding the shard."""
    width = local["target"].shape[-1]
    shard = VocabShard(axis, jax.lax.axis_index(axis).astype(jnp.int32), width)
    context = RowContext(log_space=log_space, shard=shard)

    def row(draft_tokens, draft_probs, target_probs, accept, sample):
        return verify_row(
            verifier,
            draft_tokens,
            draft_probs,
            target_probs,
            accept,
            sample,
            context,
            report=report,
            values=values,
        )

    return jax.vmap(row)(*(local.get(name) for name in StepArguments._fields))
