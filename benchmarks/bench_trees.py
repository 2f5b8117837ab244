"""Benchmark of tree verification: `python benchmarks/bench_trees.py`.

Prints one markdown table, one row per (verifier, tree size): milliseconds per call of
`verify` on a tree with its default checks (median of interleaved repeats after compilation),
the same unchecked, and both against a jitted read of the same inputs (`jnp.sum` of
every array: each byte read once, the floor any verifier that reads its inputs can
reach). Beside them, the bytes XLA's cost analysis counts for each compiled program
against the read's (a while loop's body counted once), and the mean accepted length.

Shapes: B = 64 trees of N = 64 and 256 nodes over V = 32,000, float32, the layout of
serving trees (wide near the root, depth 5), siblings distinct (drafted without
replacement), target and draft rows random.

A second table, trees as data: `verify` on a tree on a fixed shape given statically (the
verifier's `tree`, one compiled program per shape) against the same shape as a traced
per-row parent array (one program for every shape of up to N nodes): compiles, compile
seconds and milliseconds per call, over 8 shapes of N = 64 nodes. A third, the decoding
loop on the demo's models: an EAGLE-2 `DynamicTree` against a static `Tree` of as many
nodes, both verified by `DeterministicCandidates`: tokens per target call and wall-clock
tokens per second.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from bench_decoding import prompts

import eqx_specdec as es
from benchmarks.contract_calls import tree_accept


def _widths(nodes: int) -> list[int]:
    """Nodes per depth, wide near the root (EAGLE-2-like), summing to `nodes`."""
    shares = np.array([1, 3, 5, 5, 6], float)
    widths = np.maximum(1, np.round(shares / shares.sum() * nodes)).astype(int)
    widths[-1] += nodes - widths.sum()
    return widths.tolist()


def _layered_tree(widths: list[int], parent_of) -> tuple[int, ...]:
    """Parents in depth-first order of a tree with `widths[d]` nodes at depth `d + 1`;
    node `k` of a level hangs under `previous[parent_of(k, depth, width, len(previous))]`
    of the level above."""
    children: dict[int, list[int]] = {-1: []}
    previous, next_id = [-1], 0
    for depth, width in enumerate(widths):
        level = []
        for k in range(width):
            parent = previous[parent_of(k, depth, width, len(previous))]
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


def serving_tree(nodes: int) -> tuple[int, ...]:
    """A tree with `_widths(nodes)` nodes per depth, each level's nodes spread evenly
    over the previous level's."""
    return _layered_tree(
        _widths(nodes), lambda k, depth, width, above: k * above // width
    )


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
                return tree_accept(*a, verifier=verifier)

            def unchecked(*a, verifier=verifier):
                return tree_accept(*a, verifier=verifier, check_inputs="off")

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


def _shapes(nodes: int, count: int) -> list[tuple[int, ...]]:
    """`count` different serving-like shapes of `nodes` nodes: the first level's width
    and the nodes' parents shifted with the shape's index."""
    shapes = []
    for shift in range(count):
        widths = _widths(nodes)
        widths[0] = max(1, widths[0] + shift % 3 - 1)
        widths[-1] = nodes - sum(widths[:-1])
        shapes.append(
            _layered_tree(
                widths,
                lambda k, depth, width, above, shift=shift: (k + shift * depth) % above,
            )
        )
    return shapes


def trees_as_data(batch: int, vocab: int, nodes: int, count: int, repeats: int):
    """Static shapes (one program each) against traced parent arrays (one program)."""
    shapes = _shapes(nodes, count)
    rule = es.DeterministicCandidates()
    traced = jax.jit(
        lambda x, parents, p, u, s: tree_accept(
            x, parents, None, p, u, s, verifier=es.TreeVerifier(rule)
        )
    )
    static_compile = traced_compile = 0.0
    static_ms, traced_ms, same = [], [], True
    for i, shape in enumerate(shapes):
        x, parents, _, p, u, s = inputs(batch, shape, vocab, seed=i)
        static = jax.jit(
            lambda x, p, u, s, shape=shape: tree_accept(
                x, None, None, p, u, s, verifier=es.TreeVerifier(rule, tree=shape)
            )
        )
        start = time.perf_counter()
        jax.block_until_ready(static(x, p, u, s))
        static_compile += time.perf_counter() - start
        start = time.perf_counter()
        out = jax.block_until_ready(traced(x, parents, p, u, s))
        traced_compile += time.perf_counter() - start
        same &= bool(np.array_equal(out["tokens"], static(x, p, u, s)["tokens"]))
        static_ms.append(_median_ms(static, (x, p, u, s), repeats))
        traced_ms.append(_median_ms(traced, (x, parents, p, u, s), repeats))
    compiles = traced._cache_size()
    print()
    print(
        "| shapes (B, N, V) | static: compiles | static: first calls (s) | "
        "traced: compiles | traced: first calls (s) | static (ms) | traced (ms) | "
        "traced / static | same tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {count} ({batch}, {nodes}, {vocab}) | {count} | {static_compile:.1f} | "
        f"{compiles} | {traced_compile:.1f} | {statistics.median(static_ms):.2f} | "
        f"{statistics.median(traced_ms):.2f} | "
        f"{statistics.median(traced_ms) / statistics.median(static_ms):.2f} | {same} |"
    )


def dynamic_loop(batch: int, nodes: int, layers: int, branching: int, repeats: int):
    """The decoding loop with an EAGLE-2 dynamic tree against a static tree of as
    many nodes (the serving layout's), both with deterministic candidates, and against
    plain decoding of the same target (`autoregressive_decode`, one compiled loop: what
    a user runs without speculation), timed in turn, each median of `repeats`."""
    draft, target = es.demo.builtin_models()
    tokens, lengths = prompts(batch)
    rule = es.DeterministicCandidates()
    length = 128
    speculative = {
        f"DynamicTree({nodes}, {layers}, {branching})": dict(
            verifier=es.TreeVerifier(rule),
            proposal=es.DynamicTree(nodes, layers, branching),
        ),
        f"Tree (static, {nodes} nodes, depth {len(_widths(nodes))})": dict(
            verifier=es.TreeVerifier(rule, tree=serving_tree(nodes))
        ),
    }
    runs = {
        name: lambda key, options=options: es.speculative_decode(
            draft, target, tokens, lengths, length, key, **options
        )
        for name, options in speculative.items()
    }
    runs["plain decoding of the target"] = lambda key: es.autoregressive_decode(
        target, tokens, lengths, length, key, check_models=False
    )
    times = {name: [] for name in runs}
    per_call = {}
    for name, run in runs.items():  # compile, and the tokens per call
        result = jax.block_until_ready(run(jax.random.key(0)))
        per_call[name] = (
            result.tokens_per_call() if hasattr(result, "tokens_per_call") else 1.0
        )
    for r in range(repeats):  # interleaved
        for name, run in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(run(jax.random.key(r + 1)))
            times[name].append(time.perf_counter() - start)
    print()
    print("| decoding | B | tokens per target call | ms per run | tokens / s |")
    print("|---|---|---|---|---|")
    for name in runs:
        ms = 1e3 * statistics.median(times[name])
        print(
            f"| {name} | {batch} | {per_call[name]:.2f} | {ms:.0f} | "
            f"{batch * length / (ms / 1e3):.0f} |"
        )


if __name__ == "__main__":
    main()
    trees_as_data(64, 32_000, 64, 8, 5)
    dynamic_loop(64, 16, 5, 4, 3)
