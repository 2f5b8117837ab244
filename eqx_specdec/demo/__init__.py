"""The demo's models and data: a character vocabulary and codec, a small corpus of
public-domain prose, n-gram models fit on it, and two small transformers trained on it
(their weights ship in this submodule's `data` folder and load when first asked for).

Nothing here is needed to verify draft tokens: `import eqx_specdec` does not import this
submodule. The command line's `demo` and the docs' examples use it; import it as
`import eqx_specdec.demo` (or `from eqx_specdec import demo`).
"""

from ._corpus import (
    builtin_corpus as builtin_corpus,
    BUILTIN_PROMPTS as BUILTIN_PROMPTS,
    decode as decode,
    encode as encode,
    VOCABULARY as VOCABULARY,
)
from ._ngram import (
    builtin_models as builtin_models,
    fit_ngram as fit_ngram,
    NGramModel as NGramModel,
)
from ._training import (
    builtin_transformers as builtin_transformers,
    train_transformer as train_transformer,
    write_builtin_transformers as write_builtin_transformers,
)
from ._transformer import Transformer as Transformer
