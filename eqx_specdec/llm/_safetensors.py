"""Loading a Llama-family model from a Hugging Face checkpoint folder: `config.json`,
the weights in safetensors files (read here with NumPy: the format is a JSON header and
raw little-endian arrays), and `tokenizer.json` with `tokenizer_config.json`."""

import json
import os
import pathlib
import struct

import jax.numpy as jnp
import numpy as np

from ._llama import Llama, LlamaConfig, LlamaLayer
from ._tokenizer import _require, Tokenizer


_DTYPES = (
    ("F32", np.float32),
    ("F16", np.float16),
    ("BF16", np.uint16),
    ("F64", np.float64),
)

#: Hugging Face's tensor names per layer, by `LlamaLayer` field.
_LAYER_TENSORS = (
    ("attention_norm", "input_layernorm"),
    ("wq", "self_attn.q_proj"),
    ("wk", "self_attn.k_proj"),
    ("wv", "self_attn.v_proj"),
    ("wo", "self_attn.o_proj"),
    ("mlp_norm", "post_attention_layernorm"),
    ("gate", "mlp.gate_proj"),
    ("up", "mlp.up_proj"),
    ("down", "mlp.down_proj"),
)


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file, as float32 NumPy arrays (BF16 and F16
    widened exactly)."""
    with open(path, "rb") as file:
        (size,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(size))
        data = file.read()
    arrays = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtypes = dict(_DTYPES)
        if entry["dtype"] not in dtypes:
            raise ValueError(
                f"{os.fspath(path)!r}: tensor `{name}` has dtype {entry['dtype']}; "
                f"load_safetensors reads {', '.join(dtypes)}."
            )
        begin, end = entry["data_offsets"]
        raw = np.frombuffer(data[begin:end], dtypes[entry["dtype"]])
        if entry["dtype"] == "BF16":  # the high half of a float32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        arrays[name] = raw.astype(np.float32).reshape(entry["shape"])
    return arrays


def write_safetensors(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    """Writes float32 `arrays` as one safetensors file (the inverse of
    `read_safetensors`, for tests and conversions)."""
    header, offset, blobs = {}, 0, []
    for name, array in arrays.items():
        blob = np.ascontiguousarray(array, np.float32).tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        offset += len(blob)
        blobs.append(blob)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for blob in blobs:
            file.write(blob)


def load_safetensors(
    directory: str | os.PathLike, *, dtype=jnp.float32, tokenizer: bool = True
) -> tuple[Llama, Tokenizer | None]:
    """Loads a Llama-family model from a Hugging Face checkpoint folder (what
    `huggingface-cli download` writes): `config.json`, `*.safetensors` (one file or
    shards; F32, F16 or BF16), and `tokenizer.json` with `tokenizer_config.json` for
    the tokenizer and chat template.

    Needs the `[llm]` extra for the tokenizer (`python -m pip install
    "eqx_specdec[llm]"`).

    **Arguments:**

    - `directory`: the checkpoint folder.
    - `dtype`: the dtype of the weights in memory and of the cache (float32 by
        default).
    - `tokenizer`: `False` to load the weights only (the tokenizer returned is `None`).

    **Returns:**

    `(model, tokenizer)`: an [`eqx_specdec.llm.Llama`][] and an
    [`eqx_specdec.llm.Tokenizer`][] (or `None`).
    """
    directory = pathlib.Path(directory)
    settings = json.loads((directory / "config.json").read_text())
    architectures = settings.get("architectures", ["LlamaForCausalLM"])
    if settings.get("model_type", "llama") not in ("llama", "mistral") or not any(
        a in ("LlamaForCausalLM", "MistralForCausalLM") for a in architectures
    ):
        raise ValueError(
            f"load_safetensors reads Llama-family checkpoints; {str(directory)!r} holds "
            f"{architectures}."
        )
    config = LlamaConfig(
        vocab_size=int(settings["vocab_size"]),
        dim=int(settings["hidden_size"]),
        layers=int(settings["num_hidden_layers"]),
        heads=int(settings["num_attention_heads"]),
        kv_heads=int(
            settings.get("num_key_value_heads") or settings["num_attention_heads"]
        ),
        hidden=int(settings["intermediate_size"]),
        rope_base=float(settings.get("rope_theta", 10000.0)),
        norm_eps=float(settings.get("rms_norm_eps", 1e-5)),
        context=int(settings.get("max_position_embeddings", 8192)),
        head_dim=settings.get("head_dim"),
    )
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{str(directory)!r} holds no `*.safetensors` file.")
    tensors = {}
    for file in files:
        tensors.update(read_safetensors(file))

    def weight(name):
        if name not in tensors:
            raise ValueError(f"The checkpoint has no tensor `{name}`.")
        w = tensors[name]
        return w if w.ndim == 1 else w.T  # (out, in) -> (in, out)

    layers = tuple(
        LlamaLayer(
            **{
                field: jnp.asarray(weight(f"model.layers.{i}.{name}.weight"), dtype)
                for field, name in _LAYER_TENSORS
            }
        )
        for i in range(config.layers)
    )
    head = None
    if not settings.get("tie_word_embeddings", False) and "lm_head.weight" in tensors:
        head = jnp.asarray(weight("lm_head.weight"), dtype)
    model = Llama(
        config,
        jnp.asarray(tensors["model.embed_tokens.weight"], dtype),
        layers,
        jnp.asarray(weight("model.norm.weight"), dtype),
        head,
    )
    return model, (_hf_tokenizer(directory) if tokenizer else None)


def _hf_tokenizer(directory: pathlib.Path) -> Tokenizer:
    tokenizers = _require("tokenizers")
    backend = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    settings_path = directory / "tokenizer_config.json"
    settings = json.loads(settings_path.read_text()) if settings_path.exists() else {}
    eos = settings.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    eos_id = backend.token_to_id(eos) if eos else None
    if eos_id is None:
        raise ValueError(
            f"{str(settings_path)!r} names no end-of-sequence token (`eos_token`) the "
            "tokenizer knows."
        )
    stops = [eos_id]
    if backend.token_to_id("<|im_end|>") is not None:
        stops.append(backend.token_to_id("<|im_end|>"))
    return Tokenizer(backend, settings.get("chat_template"), eos_id, stops)
