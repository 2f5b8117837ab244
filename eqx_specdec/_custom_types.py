"""The jaxtyping shapes of one row and of a batch, shared by the stages and entry
points."""

from jaxtyping import Array, Bool, Float, Int, Integer, Key


# One row (one sequence). `gamma` is the draft length G, `vocab` the vocabulary size V.
DraftTokensRow = Integer[Array, " gamma"]
DraftProbsRow = Float[Array, "gamma vocab"]
TargetProbsRow = Float[Array, "gamma+1 vocab"]
AcceptUniformsRow = Float[Array, " gamma"]
SampleUniform = Float[Array, ""]
# A sampler's per-row randomness: a uniform, or a key for key-driven samplers.
SampleRandomness = Float[Array, ""] | Key[Array, ""]
PassedRow = Bool[Array, " gamma"]
ScaleRow = Float[Array, " gamma"]
IntScalar = Int[Array, ""]
TokensRow = Int[Array, " gamma+1"]

# A batch of rows.
DraftTokens = Integer[Array, "batch gamma"]
DraftProbs = Float[Array, "batch gamma vocab"]
TargetProbs = Float[Array, "batch gamma+1 vocab"]
AcceptUniforms = Float[Array, "batch gamma"]
SampleRandomnessBatch = Float[Array, " batch"] | Key[Array, " batch"]

# One tree (see AbstractTreeVerifier for the layout): `nodes` is N.
NodeTokensRow = Integer[Array, " nodes"]
ParentsRow = Integer[Array, " nodes"]
TreeProbsRow = Float[Array, "nodes+1 vocab"]
NodeUniformsRow = Float[Array, " nodes"]
TreeOutputs = dict[str, Int[Array, "..."]]
