"""The passes over the rows in the compiled logits path: `python benchmarks/hlo_passes.py`.

For each warp of `bench_warps.py` (the same warp on both sides, unchecked), compiles
`verify` on `Logits` at (B, G, V) and reads XLA's optimised HLO: every operation
outside fused computations (fusions, custom calls such as TopK, sorts, reductions) with
an operand holding whole rows of V entries (its last axis V, or V split in blocks of 16)
reads those rows, or a slice of them (a fusion holding a dynamic slice of the batch's
rows reads one row). It prints how many such operations each computation holds: the
entry, loop bodies (run once per trip: under `lax.map` once per sequence, in the early
exit once per examined position) and conditional branches (one of which runs). With
`--verbose`, each operation and the shapes it reads.
"""

import argparse
import collections
import re

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.contract_calls import accept_logits
from eqx_specdec import Warp


WARPS = {
    "temperature 0.7": Warp(0.7),
    "top-k 50": Warp(0.7, top_k=50),
    "top-p 0.9": Warp(0.7, top_p=0.9),
    "min-p 0.05": Warp(0.7, min_p=0.05),
}
_SHAPE = re.compile(r"(?:f32|bf16|f16|s32|pred|u32)\[([0-9,]*)\]")


def _computations(text):
    """{name: [instruction lines]} of an HLO module's text, and the fused ones."""
    blocks, fused, name, entry = collections.OrderedDict(), set(), None, None
    for line in text.splitlines():
        head = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head:
            name = head.group(2)
            blocks[name] = []
            entry = name if head.group(1) else entry
        elif name is not None and line.strip() and line.strip() != "}":
            blocks[name].append(line.strip())
            called = re.search(r"calls=%?([\w.\-]+)", line)
            if called and " fusion(" in line:
                fused.add(called.group(1))
    return blocks, fused, entry


def passes(text, vocab):
    """[(in the entry computation, computation, opcode, shapes read)] of the operations
    outside fused computations that read whole rows (operands printed by name: their
    shapes are their definitions')."""
    blocks, fused, entry = _computations(text)
    shape_of = {}
    for lines in blocks.values():
        for line in lines:
            defined = re.match(r"(?:ROOT )?%([\w.\-]+) = (\S+)", line)
            if defined:
                shape_of[defined.group(1)] = defined.group(2)
    skip = {"get-tuple-element", "tuple", "bitcast", "parameter", "while", "call",
            "conditional", "constant", "copy-start", "copy-done"}  # fmt: skip
    found = []
    for name, lines in blocks.items():
        if name in fused:
            continue
        for line in lines:
            opcode = re.search(r"\s([a-z][a-z0-9\-_]*)\(", line.split("=", 1)[-1])
            if opcode is None or opcode.group(1) in skip:
                continue
            operands = line.split("=", 1)[-1][opcode.end() :].split("), ")[0]
            shapes = [shape_of.get(n, "") for n in re.findall(r"%([\w.\-]+)", operands)]
            rows = sorted(
                {
                    dims
                    for shape in shapes
                    for dims in _SHAPE.findall(shape)
                    if dims.split(",")[-1] == str(vocab)
                    or dims.split(",")[-2:] == [str(vocab // 16), "16"]
                }
            )
            if rows:
                found.append((name == entry, name, opcode.group(1), rows))
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64,5,128256", help="'B,G,V'")
    parser.add_argument("--verbose", action="store_true", help="list every operation")
    args = parser.parse_args(argv)
    batch, gamma, vocab = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    target = jnp.asarray(rng.standard_normal((batch, gamma + 1, vocab), np.float32))
    draft = target[:, :gamma]
    x = jnp.zeros((batch, gamma), jnp.int32)
    u, s = jnp.full((batch, gamma), 0.5), jnp.full((batch,), 0.5)
    print(
        f"JAX {jax.__version__} on {jax.default_backend()}, (B, G, V) = {args.shape}\n"
    )
    print(
        "| warp | operations reading rows, by computation (entry, loop bodies, branches) |"
    )
    print("|---|---|")
    details = {}
    for name, warp in WARPS.items():
        fn = jax.jit(
            lambda x, d, t, u, s, w=warp: accept_logits(
                x, d, t, u, s, target_warp=w, draft_warp=w, check_inputs="off"
            )
        )
        found = passes(fn.lower(x, draft, target, u, s).compile().as_text(), vocab)
        counts = collections.Counter(
            ("entry" if top else computation) for top, computation, *_ in found
        )
        cells = "; ".join(f"{c}: {n}" for c, n in counts.items())
        print(f"| {name} | {len(found)} in all ({cells}) |")
        details[name] = found
    if args.verbose:
        for name, found in details.items():
            print(f"\n{name}:")
            for _, computation, opcode, shapes in found:
                print(f"- {computation}: {opcode} reads {', '.join(shapes)}")


if __name__ == "__main__":
    main()
