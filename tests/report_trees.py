"""Prints the table of docs/trees.md: expected accepted draft tokens per step for the
standard, block and tree verifiers, on the binary toy and on one random case.

    python tests/report_trees.py
"""

import jax
import jax.numpy as jnp
import numpy as np
from lossless_cases import distributions, REFERENCE_CASE
from test_block import BLOCK

import eqx_specdec as es


def full_tree(branching, depth):
    """Parents (depth-first) and node depths of a full `branching`-ary tree."""
    parents, depths = [], []

    def grow(parent, level):
        for _ in range(branching):
            parents.append(parent)
            depths.append(level)
            me = len(parents) - 1
            if level + 1 < depth:
                grow(me, level + 1)

    grow(-1, 0)
    return np.array(parents, np.int32), np.array(depths)


def tree_expected_accepted(q, p, branching, draws=200_000, seed=0):
    """E[accepted] of a full tree of i.i.d. candidates (depth G), by Monte Carlo."""
    gamma = q.shape[0]
    parents, depths = full_tree(branching, gamma)
    nodes = len(parents)
    # Context-free: the distributions after a node depend only on its depth.
    target = jnp.asarray(np.concatenate([p[:1], p[depths + 1]]), jnp.float32)
    draft_rows = np.concatenate([q[:1], q[np.minimum(depths + 1, gamma - 1)]])
    draft = jnp.asarray(draft_rows, jnp.float32)
    law = jnp.asarray(q[depths], jnp.float32)  # node i was drawn from q at its depth
    row = jax.vmap(es.TreeVerifier().row, in_axes=(0, None, None, None, 0, 0))

    @jax.jit
    def run(key):
        k_x, k_u, k_s = jax.random.split(key, 3)
        tokens = jax.random.categorical(k_x, jnp.log(law), shape=(draws, nodes))
        u = jax.random.uniform(k_u, (draws, nodes), jnp.float32)
        s = jax.random.uniform(k_s, (draws,), jnp.float32)
        out = row(tokens.astype(jnp.int32), jnp.asarray(parents), draft, target, u, s)
        return jnp.mean(out["num_accepted"].astype(jnp.float32))

    mean = float(run(jax.random.key(seed)))
    return mean, nodes


def main():
    binary_q = np.tile([2 / 3, 1 / 3], (2, 1))
    binary_p = np.tile([1 / 3, 2 / 3], (3, 1))
    cases = {"binary toy, G = 2": (binary_q, binary_p)}
    q, p, _ = distributions(*REFERENCE_CASE)
    cases["random case (V = 8, G = 2)"] = (q, p)
    print(
        "| case | standard | block | tree, 2 candidates per node | tree, 4 candidates per node |"
    )
    print("|---|---|---|---|---|")
    for name, (q, p) in cases.items():
        standard = (
            es.evaluation.emission_by_quadrature(es.Verifier(), q, p).reached[1:].sum()
        )
        block = es.evaluation.emission_by_quadrature(BLOCK, q, p)
        block = block.reached[1:].sum()
        t2, n2 = tree_expected_accepted(q, p, 2)
        t4, n4 = tree_expected_accepted(q, p, 4)
        print(
            f"| {name} | {standard:.4f} | {block:.4f} | {t2:.4f} ({n2} nodes) | "
            f"{t4:.4f} ({n4} nodes) |"
        )


if __name__ == "__main__":
    main()
