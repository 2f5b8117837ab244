"""Benchmark of tree verification: `python benchmarks/bench_trees.py`.

Prints one markdown table, one row per (verifier, tree size): milliseconds per call of
`tree_accept` with its default checks (median of interleaved repeats after compilation),
the same unchecked, and both against a jitted read of the same inputs (`jnp.sum` of
every array: each byte read once, the floor any verifier that reads its inputs can
reach). Beside them, the bytes XLA's cost analysis counts for each compiled program
against the read's (a while loop's body counted once), and the mean accepted length.

Shapes: B = 64 trees of N = 64 and 256 nodes over V = 32,000, float32, the layout of
serving trees (wide near the root, depth 5), siblings distinct (drafted without
replacement), target and draft rows random.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import eqx_specdec as es


def _widths(nodes: int) -> list[int]:
    """Nodes per depth, wide near the root (EAGLE-2-like), summing to `nodes`."""
    shares = np.array([1, 3, 5, 5, 6], float)
    widths = np.maximum(1, np.round(shares / shares.sum() * nodes)).astype(int)
    widths[-1] += nodes - widths.sum()
    return widths.tolist()


def serving_tree(nodes: int) -> tuple[int, ...]:
    """Parents in depth-first order of a tree with `_widths(nodes)` nodes per depth, each
    level's nodes spread evenly over the previous level's."""
    children: dict[int, list[int]] = {-1: []}
    previous, next_id = [-1], 0
    for width in _widths(nodes):
        level = []
        for k in range(width):
            parent = previous[k * len(previous) // width]
            children.setdefault(parent, []).append(next_id)
            children[next_id] = []
            level.append(next_id)
            next_id += 1
        previous = level
    order, parents = [], {}

    def visit(node, parent):
        if node >= 0:
            parents[node] = parent
            order.append(node)
        for child in children[node]:
            visit(child, node)

    visit(-1, None)
    index = {node: i for i, node in enumerate(order)}
    return tuple(-1 if parents[n] < 0 else index[parents[n]] for n in order)


def inputs(batch: int, tree: tuple[int, ...], vocab: int, seed: int = 0):
    """Peaked random target and draft rows (the draft half the target, as a good
    drafter's), and each node's children drawn from the draft at it without
    replacement (Gumbel top-k), as both verifiers expect."""
    key = jax.random.key(seed)
    k_p, k_q, k_g, k_u, k_s = jax.random.split(key, 5)
    nodes = len(tree)
    shape = (batch, nodes + 1, vocab)
    p = jax.nn.softmax(3 * jax.random.normal(k_p, shape), -1)
    q = 0.5 * p + 0.5 * jax.nn.softmax(3 * jax.random.normal(k_q, shape), -1)
    tokens = jnp.zeros((batch, nodes), jnp.int32)
    for parent in sorted(set(tree)):
        siblings = [i for i, a in enumerate(tree) if a == parent]
        k_g, k = jax.random.split(k_g)
        scores = jnp.log(q[:, parent + 1]) + jax.random.gumbel(k, (batch, vocab))
        _, top = jax.lax.top_k(scores, len(siblings))
        tokens = tokens.at[:, jnp.asarray(siblings)].set(top.astype(jnp.int32))
    parents = jnp.tile(jnp.asarray(tree, jnp.int32), (batch, 1))
    u = jax.random.uniform(k_u, (batch, nodes))
    s = jax.random.uniform(k_s, (batch,))
    return tokens, parents, q, p, u, s


def _median_ms(fn, args, repeats):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _bytes(fn, args) -> float:
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("bytes accessed", float("nan")))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--nodes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"devices: {jax.devices()}")
    print(
        "| verifier | B | N | V | default (ms) | unchecked (ms) | read (ms) | "
        "default / read | unchecked / read | bytes / read bytes | mean accepted |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for nodes in args.nodes:
        tree = serving_tree(nodes)
        depth = len(_widths(nodes))
        data = inputs(args.batch, tree, args.vocab)
        verifiers = {
            "top-down (without replacement)": es.TreeVerifier(
                es.WithoutReplacementCandidates()
            ),
            f"traversal (max_depth={depth})": es.TraversalVerifier(max_depth=depth),
        }

        def read(*a):
            return sum(jnp.sum(x.astype(jnp.float32)) for x in a)

        read_jit = jax.jit(read)
        read_ms = _median_ms(read_jit, data, args.repeats)
        read_bytes = _bytes(read, data)
        for name, verifier in verifiers.items():

            def default(*a, verifier=verifier):
                return es.tree_accept(*a, verifier=verifier)

            def unchecked(*a, verifier=verifier):
                return es.tree_accept(*a, verifier=verifier, check_inputs="off")

            default_ms = _median_ms(default, data, args.repeats)
            unchecked_ms = _median_ms(unchecked, data, args.repeats)
            program_bytes = _bytes(unchecked, data)
            out = unchecked(*data)
            tested = float(np.mean(np.asarray(out["num_accepted"])))
            print(
                f"| {name} | {args.batch} | {nodes} | {args.vocab} | {default_ms:.1f} | "
                f"{unchecked_ms:.1f} | {read_ms:.1f} | {default_ms / read_ms:.2f} | "
                f"{unchecked_ms / read_ms:.2f} | {program_bytes / read_bytes:.2f} | "
                f"{tested:.2f} |"
            )


if __name__ == "__main__":
    main()
