"""The verification step of speculative decoding as typed, composable Equinox stages."""

import importlib as _importlib
import importlib.metadata as _metadata

from . import evaluation as evaluation, families as families, models as models
from ._chain.abstract_verifier import AbstractVerifier as AbstractVerifier
from ._chain.verifier import Verifier as Verifier
from ._decoding.autoregressive import autoregressive_decode as autoregressive_decode
from ._decoding.loop import speculative_decode as speculative_decode
from ._decoding.result import DecodeResult as DecodeResult
from ._entry.entry import speculative_accept as speculative_accept, verify as verify
from ._entry.verification import Verification as Verification
from ._errors import MissingCapabilityError as MissingCapabilityError
from ._inputs.example_inputs import example_inputs as example_inputs
from ._inputs.logprobs import LogProbs as LogProbs
from ._inputs.results import RESULTS as RESULTS
from ._inputs.typed_inputs import (
    Draft as Draft,
    Logits as Logits,
    Probabilities as Probabilities,
    Uniforms as Uniforms,
)
from ._proposal.abstract_proposal import AbstractProposal as AbstractProposal
from ._proposal.chain import Chain as Chain
from ._proposal.draft_length import (
    AbstractDraftLength as AbstractDraftLength,
    FixedDraftLength as FixedDraftLength,
    StopWhenUnlikely as StopWhenUnlikely,
)
from ._proposal.dynamic_tree import DynamicTree as DynamicTree
from ._proposal.tree import Tree as Tree
from ._sharding import ShardedVerifier as ShardedVerifier
from ._stages.block import (
    BlockRatioTest as BlockRatioTest,
    LastSuccessCounter as LastSuccessCounter,
)
from ._stages.greedy import (
    ArgmaxSampler as ArgmaxSampler,
    GreedyRatioTest as GreedyRatioTest,
)
from ._stages.gumbel import GumbelSampler as GumbelSampler
from ._stages.prefix_counter import (
    AbstractPrefixCounter as AbstractPrefixCounter,
    PrefixCounter as PrefixCounter,
)
from ._stages.ratio_test import AbstractRatioTest as AbstractRatioTest
from ._stages.relaxed import (
    FLyRatioTest as FLyRatioTest,
    ScheduledRatioTest as ScheduledRatioTest,
    TopNRelaxedRatioTest as TopNRelaxedRatioTest,
)
from ._stages.residual_sampler import (
    AbstractResidualSampler as AbstractResidualSampler,
    ResidualSampler as ResidualSampler,
)
from ._stages.row_context import RowContext as RowContext
from ._stages.row_sums import RowSums as RowSums
from ._stages.synthetic import SyntheticRatioTest as SyntheticRatioTest
from ._stages.threshold_rule import (
    AbstractThresholdRule as AbstractThresholdRule,
    LenientRatioTest as LenientRatioTest,
    RatioTest as RatioTest,
)
from ._stages.token_assembler import (
    AbstractTokenAssembler as AbstractTokenAssembler,
    TokenAssembler as TokenAssembler,
)
from ._stages.typical import (
    TypicalRatioTest as TypicalRatioTest,
    TypicalSampler as TypicalSampler,
)
from ._stages.verdict import Verdict as Verdict
from ._stages.vocab_shard import VocabShard as VocabShard
from ._tree.abstract_tree_verifier import AbstractTreeVerifier as AbstractTreeVerifier
from ._tree.multi_draft import (
    GreedyMultiDraft as GreedyMultiDraft,
    ImportanceSampling as ImportanceSampling,
    SpecHub as SpecHub,
    SpecTrKSeq as SpecTrKSeq,
)
from ._tree.node_rules import (
    AbstractNodeRule as AbstractNodeRule,
    DeterministicCandidates as DeterministicCandidates,
    IIDCandidates as IIDCandidates,
    ResidualState as ResidualState,
    WithoutReplacementCandidates as WithoutReplacementCandidates,
)
from ._tree.top_down import TreeVerifier as TreeVerifier
from ._tree.traversal import TraversalVerifier as TraversalVerifier
from ._warps.warp import Warp as Warp


try:
    __version__ = _metadata.version("eqx_specdec")
except _metadata.PackageNotFoundError:  # a source checkout on the path
    __version__ = "unknown"


def __getattr__(name: str):
    # `eqx_specdec.demo` on first use: the demo's models and data are not imported with
    # the library.
    if name == "demo":
        return _importlib.import_module(".demo", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
