"""Real language models for the decoding loop: a Llama-family decoder in Equinox
([`eqx_specdec.llm.Llama`][]), loaded from a GGUF file or a Hugging Face checkpoint with
its tokenizer and chat template, and the command that fetches SmolLM2-135M-Instruct.

Nothing here is needed to verify draft tokens: `import eqx_specdec` does not import this
submodule. Its loaders need the `[llm]` extra (`python -m pip install
"eqx_specdec[llm]"`): the `gguf`, `tokenizers` and `jinja2` packages.
"""

from ._fetch import fetch_smollm2 as fetch_smollm2, SMOLLM2 as SMOLLM2
from ._gguf import load_gguf as load_gguf
from ._llama import (
    Llama as Llama,
    LlamaConfig as LlamaConfig,
    LlamaLayer as LlamaLayer,
)
from ._prompts import CHAT_PROMPTS as CHAT_PROMPTS
from ._record import (
    continue_prompts as continue_prompts,
    record_rows as record_rows,
    RecordedRows as RecordedRows,
)
from ._safetensors import load_safetensors as load_safetensors
from ._tokenizer import Tokenizer as Tokenizer
