"""The jaxtyping shapes of one row and of a batch, shared by the stages and entry
points."""

from jaxtyping import Array, Bool, Float, Int, Integer, Key


# One row (one sequence). `G` is the draft length, `V` the vocabulary size, `B` the batch.
DraftTokensRow = Integer[Array, " G"]
DraftProbsRow = Float[Array, "G V"]
TargetProbsRow = Float[Array, "G+1 V"]
AcceptUniformsRow = Float[Array, " G"]
SampleUniform = Float[Array, ""]
# A sampler's per-row randomness: a uniform, or a key for key-driven samplers.
SampleRandomness = Float[Array, ""] | Key[Array, ""]
PassedRow = Bool[Array, " G"]
ScaleRow = Float[Array, " G"]
IntScalar = Int[Array, ""]
TokensRow = Int[Array, " G+1"]

# A batch of rows.
DraftTokens = Integer[Array, "B G"]
DraftProbs = Float[Array, "B G V"]
TargetProbs = Float[Array, "B G+1 V"]
AcceptUniforms = Float[Array, "B G"]
SampleRandomnessBatch = Float[Array, " B"] | Key[Array, " B"]

# One tree (see AbstractTreeVerifier for the layout): `nodes` is N.
NodeTokensRow = Integer[Array, " nodes"]
ParentsRow = Integer[Array, " nodes"]
TreeProbsRow = Float[Array, "nodes+1 V"]
NodeUniformsRow = Float[Array, " nodes"]
TreeOutputs = dict[str, Int[Array, "..."]]
