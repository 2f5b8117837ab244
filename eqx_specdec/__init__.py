import importlib.metadata

from ._lossless import (
    emission_by_monte_carlo as emission_by_monte_carlo,
    emission_by_quadrature as emission_by_quadrature,
    EmissionEstimate as EmissionEstimate,
)
from ._stages.assemblers import (
    AbstractTokenAssembler as AbstractTokenAssembler,
    TokenAssembler as TokenAssembler,
)
from ._stages.prefix_counters import (
    AbstractPrefixCounter as AbstractPrefixCounter,
    PrefixCounter as PrefixCounter,
)
from ._stages.ratio_tests import (
    AbstractRatioTest as AbstractRatioTest,
    RatioTest as RatioTest,
)
from ._stages.samplers import (
    AbstractResidualSampler as AbstractResidualSampler,
    ResidualSampler as ResidualSampler,
)
from ._stages.verdict import Verdict as Verdict
from ._verifier import speculative_accept as speculative_accept, Verifier as Verifier


__version__ = importlib.metadata.version("eqx_specdec")
