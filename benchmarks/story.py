"""The speed story's one claim, computed from the generated tables.

`benchmarks/run_all.py` writes every table to `benchmarks/results-BACKEND.md`, then calls
`claim` on that text: the sentence the docs' home page and Performance page carry. The test
suite recomputes it from the committed results and compares (`tests/test_snippets.py`), so
a hand-edited number, or tables regenerated without the claim, fail.
"""

import re


# The serving shapes of the claim: rows B of at least this many.
SERVING_BATCH = 64
# The cut-off warps of `bench_warps.py` (each at temperature 0.7), in the claim's order.
CUT_OFFS = ("top-k 50", "top-p 0.9", "min-p 0.05")


def table(text: str, header_start: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table in `text` whose header begins with
    `header_start`, as dictionaries from column name to cell."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| " + header_start):
            names = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip("|").split("|")]
                rows.append(dict(zip(names, cells)))
            return rows
    raise ValueError(f"no table whose header starts with {header_start!r}")


def _ratio(cell: str) -> float:
    # "27.5x", or "218 / 0.8x" (a time, then the ratio).
    return float(re.findall(r"([0-9.]+)x", cell)[-1])


def _span(values: list[float], digits: int) -> str:
    low, high = min(values), max(values)
    return f"{low:.{digits}f}x to {high:.{digits}f}x"


def claim(results: str) -> str:
    """The claim sentence, from the text of a results file."""
    machine = re.search(r"^- machine: (.+)$", results, re.M)
    where = machine.group(1) if machine else "this machine"
    rows = [
        row
        for row in table(results, "B, G, V | naive JAX")
        if int(row["B, G, V"].split(",")[0]) >= SERVING_BATCH
    ]
    if not rows or "PyTorch, default" not in rows[0]:
        raise ValueError("the results hold no PyTorch column at serving shapes")
    torch = _span([_ratio(r["PyTorch, default"]) for r in rows], 0)
    naive = _span([_ratio(r["naive JAX"]) for r in rows], 0)
    warps = table(results, "B, G, V | PyTorch temperature")
    warped = _span([_ratio(r["PyTorch temperature (ms) / ours"]) for r in warps], 1)
    plain = table(results, "B, G, V | JAX temperature 0.7")
    cut_offs = [f"JAX {name} (ms) / ours" for name in CUT_OFFS]
    cut = _span([_ratio(r[name]) for r in plain for name in cut_offs], 1)
    plain = _span([_ratio(r["JAX temperature 0.7 (ms) / ours"]) for r in plain], 1)
    return (
        f"On {where}, verification from probabilities with the default checks is "
        f"{torch} faster than a vLLM-style PyTorch implementation and {naive} faster "
        f"than a naive JAX one at serving shapes (B = {SERVING_BATCH} and 256, V = 32,000 "
        f"and 128,256); from logits with a temperature, warping and verifying is {warped} "
        f"as fast as PyTorch warping the same rows without verifying them, and {plain} "
        "as fast as `jax.nn.softmax` then verification in one `jax.jit`; with "
        f"{', '.join(CUT_OFFS[:-1])} or {CUT_OFFS[-1]} as well, {cut} as fast as the "
        "same warp written in `jax.numpy` then verification."
    )
