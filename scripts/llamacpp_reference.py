"""Reference logits and token ids from llama.cpp for the test suite's comparison of
`eqx_specdec.llm` with an implementation no one here wrote.

Run once on a developer's machine, in an environment with `llama-cpp-python` (it builds
llama.cpp from source, about 15 minutes on 2 cores) and the `[llm]` extra:

    python -m pip install llama-cpp-python ".[llm]"
    python scripts/llamacpp_reference.py

It fetches SmolLM2-135M-Instruct (`eqx_specdec.llm.fetch_smollm2`), renders a few fixed
chat prompts with the model's own template, and writes for each: llama.cpp's token ids
of the rendered text, and at every position the 32 largest logits, their ids and the
row's log-sum-exp, into `tests/fixtures/smollm2_llamacpp.npz` (a few hundred KB). CI
never builds llama.cpp: it reads this file.
"""

import pathlib

import numpy as np


PROMPTS = (
    "What is the capital of France?",
    "Summarise in one sentence: The Eiffel Tower is a wrought-iron lattice tower on "
    "the Champ de Mars in Paris, France. It is named after the engineer Gustave "
    "Eiffel, whose company designed and built the tower from 1887 to 1889.",
    "Rename the variable x to total in this code:\ndef f(xs):\n    x = 0\n    for v "
    "in xs:\n        x += v\n    return x",
    "Write a haiku about the sea, then count its syllables: 5, 7, 5. Numbers like "
    "1234567 and symbols like $%& must tokenise too.",
)
TOP = 32
OUT = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures"


def main():
    import llama_cpp

    from eqx_specdec.llm import fetch_smollm2, load_gguf

    path = fetch_smollm2()
    _, tokenizer = load_gguf(path)
    llm = llama_cpp.Llama(
        str(path), n_ctx=512, logits_all=True, n_threads=2, verbose=False, seed=0
    )
    arrays = {}
    for i, prompt in enumerate(PROMPTS):
        text = tokenizer.chat(prompt)
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        logits = np.asarray(llm.scores[: len(ids)], np.float64)
        top = np.argsort(-logits, axis=-1)[:, :TOP]
        peak = logits.max(-1, keepdims=True)
        lse = peak[:, 0] + np.log(np.exp(logits - peak).sum(-1))
        arrays[f"text_{i}"] = np.frombuffer(text.encode(), np.uint8)
        arrays[f"ids_{i}"] = np.asarray(ids, np.int32)
        arrays[f"top_ids_{i}"] = top.astype(np.int32)
        arrays[f"top_logits_{i}"] = np.take_along_axis(logits, top, -1).astype(
            np.float32
        )
        arrays[f"lse_{i}"] = lse.astype(np.float32)
    arrays["llama_cpp_version"] = np.frombuffer(
        llama_cpp.__version__.encode(), np.uint8
    )
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / "smollm2_llamacpp.npz", **arrays)
    print(f"wrote {OUT / 'smollm2_llamacpp.npz'}")


if __name__ == "__main__":
    main()
