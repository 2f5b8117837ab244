"""Benchmark of the verification step: `python benchmarks/bench.py`.

Prints two markdown tables, one row per shape (B, G, V): microseconds per call (median of
interleaved repeats after compilation, inputs rotated over several copies so that calls
read from memory rather than cache), the effective read bandwidth over the bytes the step
must read (`B*G*2*4 + B*V*2*4` for float32: the draft token's p and q at every position,
and rows n of p and q), its share of the machine's read bandwidth measured in the same
run (a jitted `jnp.sum` over 1 GiB), the cost of the check levels (`check_inputs="read"`,
the default, against the unchecked call, directly and under a caller's `jax.jit`; `"all"`
against a jitted read of all of p and q),
and ratios against a naive JAX implementation
(residual and full cumsum at every position), a PyTorch implementation in the style of
vLLM and Hugging Face (needs the `bench` extra), a hand-written `jax.jit` of the same
verifier (what the entry point's filter-semantics dispatch costs on top), and a minimal
`jax.jit` function (the dispatch floor). The ratios to the hand-written `jax.jit` come from a
second interleaved pass over the JAX implementations alone. Last, the compile time of the
default (checked) program at B = 1,000 and 200,000, and of each entry point at each check
level.
"""

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from eqx_specdec import speculative_accept


SHAPES = [
    (4, 4, 6),
    (1, 5, 32_000),
    (16, 5, 32_000),
    (64, 5, 128_256),
    (256, 8, 32_000),
    (64, 8, 32_000),
    (64, 16, 32_000),
]


def naive_jax(
    draft_tokens, draft_probs, target_probs, accept_uniforms, sample_uniforms
):
    """The contract written the obvious way: the residual, its normalisation and a full
    cumulative sum at every position, then pick row n."""
    batch, gamma = draft_tokens.shape
    vocab = target_probs.shape[-1]
    idx = draft_tokens[..., None]
    p_x = jnp.take_along_axis(target_probs[:, :gamma], idx, -1)[..., 0]
    q_x = jnp.take_along_axis(draft_probs, idx, -1)[..., 0]
    accepted = accept_uniforms * q_x < p_x
    n = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)
    residual = jnp.maximum(target_probs[:, :gamma] - draft_probs, 0)
    residual = jnp.concatenate([residual, target_probs[:, gamma:]], axis=1)
    total = residual.sum(-1, keepdims=True)
    residual = jnp.where(
        total > 0, residual / jnp.where(total > 0, total, 1), target_probs
    )
    cdf = jnp.cumsum(residual, axis=-1)
    cdf_n = jnp.take_along_axis(cdf, n[:, None, None], 1)[:, 0]
    y = jnp.minimum(jnp.sum(cdf_n <= sample_uniforms[:, None], -1), vocab - 1)
    position = jnp.arange(gamma + 1)
    padded = jnp.concatenate([draft_tokens, jnp.zeros((batch, 1), jnp.int32)], 1)
    tokens = jnp.where(
        position < n[:, None], padded, jnp.where(position == n[:, None], y[:, None], -1)
    )
    return n.astype(jnp.int32), tokens.astype(jnp.int32)


def torch_verify(
    draft_tokens, draft_probs, target_probs, accept_uniforms, sample_uniforms
):
    """The same contract in PyTorch, written the way vLLM's and Hugging Face's samplers
    are: vectorised gathers, the recovered (residual) distribution at every position,
    cumsum and searchsorted."""
    import torch

    batch, gamma = draft_tokens.shape
    vocab = target_probs.shape[-1]
    idx = draft_tokens.unsqueeze(-1)
    p_x = target_probs[:, :gamma].gather(-1, idx).squeeze(-1)
    q_x = draft_probs.gather(-1, idx).squeeze(-1)
    accepted = accept_uniforms * q_x < p_x
    n = torch.cumprod(accepted.int(), dim=1).sum(dim=1)
    residual = torch.clamp(target_probs[:, :gamma] - draft_probs, min=0)
    residual = torch.cat([residual, target_probs[:, gamma:]], dim=1)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total, target_probs)
    row = residual[torch.arange(batch), n]
    cdf = torch.cumsum(row, dim=-1)
    y = torch.searchsorted(cdf, sample_uniforms.unsqueeze(-1), right=True).squeeze(-1)
    y = y.clamp(max=vocab - 1)
    position = torch.arange(gamma + 1).unsqueeze(0)
    padded = torch.cat(
        [draft_tokens, torch.zeros(batch, 1, dtype=draft_tokens.dtype)], 1
    )
    n_col = n.unsqueeze(1)
    minus_one = torch.full_like(padded, -1)
    tokens = torch.where(
        position < n_col,
        padded,
        torch.where(position == n_col, y.unsqueeze(1), minus_one),
    )
    return n.int(), tokens.int()


# The entry point jitted by hand (a caller's `jax.jit`, inside which its own
# `eqx.filter_jit` is inlined): the same program, without Equinox's dispatch (flattening
# the arguments, the verifier included, and looking up the compiled function). The
# dispatch is measured against it.
hand_jit = jax.jit(functools.partial(speculative_accept, check_inputs="off"))
hand_jit_checked = jax.jit(functools.partial(speculative_accept, check_inputs="read"))


@jax.jit
def read_all(draft_tokens, draft_probs, target_probs, accept_uniforms, sample_uniforms):
    """A jitted read of all of p and q: what the complete check level must at least
    cost."""
    return jnp.sum(draft_probs) + jnp.sum(target_probs)


@jax.jit
def minimal_jit(
    draft_tokens, draft_probs, target_probs, accept_uniforms, sample_uniforms
):
    """The dispatch floor: a jitted function with the same inputs and outputs doing
    almost nothing."""
    n = jnp.zeros(draft_tokens.shape[0], jnp.int32)
    return n, jnp.concatenate([draft_tokens, n[:, None]], axis=1)


def _inputs(seed, batch, gamma, vocab):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((batch, gamma + 1, vocab), dtype=np.float32)
    target = np.exp(logits - logits.max(-1, keepdims=True))
    target /= target.sum(-1, keepdims=True)
    draft_logits = logits[:, :gamma] + rng.standard_normal(
        (batch, gamma, vocab), dtype=np.float32
    )
    draft = np.exp(draft_logits - draft_logits.max(-1, keepdims=True))
    draft /= draft.sum(-1, keepdims=True)
    tokens = rng.integers(0, vocab, (batch, gamma)).astype(np.int32)
    accept = rng.random((batch, gamma), dtype=np.float32)
    sample = rng.random(batch, dtype=np.float32)
    return tokens, draft, target, accept, sample


def _read_bandwidth(repeats: int) -> float:
    """GB/s of a jitted float32 sum over 1 GiB, median of `repeats`."""
    data = jnp.ones((1 << 28,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(data).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        total(data).block_until_ready()
        times.append(time.perf_counter() - start)
    del data
    return (1 << 30) / statistics.median(times) / 1e9


def _temp_megabytes(fn, args) -> float:
    """Temporary memory of the compiled program (XLA's memory analysis), in MB."""
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes / 1e6


def _block(out):
    if isinstance(out, dict):
        out = tuple(out.values())
    return jax.block_until_ready(out)


def _interleaved(impls, device, torch_inputs, copies, repeats) -> dict:
    """Seconds per call of each implementation, interleaved, the order rotated every
    repeat so that none always follows another."""
    times = {name: [] for name in impls}
    names = list(impls)
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            args = (torch_inputs if name == "PyTorch" else device)[r % copies]
            start = time.perf_counter()
            _block(impls[name](*args))
            times[name].append(time.perf_counter() - start)
    return times


def benchmark(shapes, repeats: int, with_torch: bool) -> list[dict]:
    bandwidth = _read_bandwidth(max(repeats, 5))
    library = functools.partial(speculative_accept, check_inputs="off")
    library_checked = speculative_accept
    naive = jax.jit(naive_jax)
    impls = {
        "eqx_specdec": library,
        "eqx_specdec, checks on": library_checked,
        "eqx_specdec, all checks": functools.partial(
            speculative_accept, check_inputs="all"
        ),
        "read of p and q": read_all,
        "naive JAX": naive,
        "hand-written jax.jit": hand_jit,
        "hand-written jax.jit, checks on": hand_jit_checked,
        "minimal jax.jit": minimal_jit,
    }
    if with_torch:
        import torch

        impls["PyTorch"] = torch.no_grad()(torch_verify)
    rows = []
    for batch, gamma, vocab in shapes:
        bytes_needed = batch * gamma * 2 * 4 + batch * vocab * 2 * 4
        bytes_per_copy = batch * (2 * gamma + 1) * vocab * 4
        # Enough copies to overflow a large last-level cache (480 MiB on the machine the
        # docs' numbers come from), so that most calls read from memory.
        copies = int(min(64, max(2, np.ceil(1.2e9 / bytes_per_copy))))
        host = [_inputs(seed, batch, gamma, vocab) for seed in range(copies)]
        device = [tuple(jnp.asarray(a) for a in inputs) for inputs in host]
        torch_inputs = []
        if with_torch:
            import torch

            torch_inputs = [
                tuple(torch.from_numpy(a) for a in inputs) for inputs in host
            ]
        for name, impl in impls.items():  # compile, and check agreement
            _block(impl(*(torch_inputs[0] if name == "PyTorch" else device[0])))
        # All implementations interleaved; then the JAX ones alone, for the dispatch
        # ratios (PyTorch's OpenMP threads keep spinning after its calls, which at
        # microsecond shapes slows whatever runs next).
        times = _interleaved(impls, device, torch_inputs, copies, repeats)
        jax_only = {k: v for k, v in impls.items() if k != "PyTorch"}
        dispatch = _interleaved(jax_only, device, [], copies, repeats)
        median = {name: statistics.median(t) for name, t in times.items()}
        alone = {name: statistics.median(t) for name, t in dispatch.items()}
        temp_ours = _temp_megabytes(library, device[0])
        temp_naive = _temp_megabytes(naive_jax, device[0])
        ours = median["eqx_specdec"]
        checked = median["eqx_specdec, checks on"]
        rows.append(
            dict(
                shape=(batch, gamma, vocab),
                us=ours * 1e6,
                us_checked=checked * 1e6,
                us_all=median["eqx_specdec, all checks"] * 1e6,
                checked_ratio=checked / ours,
                all_ratio=median["eqx_specdec, all checks"] / median["read of p and q"],
                torch_checked=median["PyTorch"] / checked if with_torch else None,
                gbps=bytes_needed / ours / 1e9,
                percent=100 * bytes_needed / ours / 1e9 / bandwidth,
                naive=median["naive JAX"] / ours,
                torch=median["PyTorch"] / ours if with_torch else None,
                hand=alone["eqx_specdec"] / alone["hand-written jax.jit"],
                hand_checked=alone["eqx_specdec, checks on"]
                / alone["hand-written jax.jit, checks on"],
                minimal=ours / median["minimal jax.jit"],
                jit_checked_ratio=alone["hand-written jax.jit, checks on"]
                / alone["hand-written jax.jit"],
                temp_ours=temp_ours,
                temp_naive=temp_naive,
                bandwidth=bandwidth,
            )
        )
        del host, device, torch_inputs
    return rows


def print_table(rows):
    print(
        f"Read bandwidth (jitted jnp.sum over 1 GiB): {rows[0]['bandwidth']:.1f} GB/s\n"
    )
    print("Check levels (microseconds per call, medians):\n")
    print(
        "| B, G, V | unchecked | default | default / unchecked | the same in a "
        "caller's jit | complete | complete / read of p, q | unchecked: % of read "
        "bandwidth |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['shape'][0]}, {r['shape'][1]}, {r['shape'][2]} | {r['us']:.0f} | "
            f"{r['us_checked']:.0f} | {r['checked_ratio']:.2f}x | "
            f"{r['jit_checked_ratio']:.2f}x | {r['us_all']:.0f} | "
            f"{r['all_ratio']:.2f}x | {r['percent']:.0f}% ({r['gbps']:.1f} GB/s) |"
        )
    print("\nAgainst the alternatives (time of theirs / time of ours):\n")
    print(
        "| B, G, V | naive JAX | PyTorch, unchecked | PyTorch, default | ours / "
        "hand-written jax.jit, off / on | ours / minimal jax.jit | temp MB, ours / naive |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        torch_ratio = "n/a" if r["torch"] is None else f"{r['torch']:.1f}x"
        torch_checked = (
            "n/a" if r["torch_checked"] is None else f"{r['torch_checked']:.1f}x"
        )
        print(
            f"| {r['shape'][0]}, {r['shape'][1]}, {r['shape'][2]} | {r['naive']:.1f}x | "
            f"{torch_ratio} | {torch_checked} | {r['hand']:.2f}x / "
            f"{r['hand_checked']:.2f}x | {r['minimal']:.2f}x | "
            f"{r['temp_ours']:.1f} / {r['temp_naive']:.1f} |"
        )


def compile_seconds(batches=(1_000, 200_000), gamma=4, vocab=1_000) -> dict:
    """Seconds to lower and compile the default (checked) entry point's program, per
    batch size: the messages are built once per problem, not per row."""
    times = {}
    for batch in batches:
        args = [
            jax.ShapeDtypeStruct(shape, dtype)
            for shape, dtype in (
                ((batch, gamma), jnp.int32),
                ((batch, gamma, vocab), jnp.float32),
                ((batch, gamma + 1, vocab), jnp.float32),
                ((batch, gamma), jnp.float32),
                ((batch,), jnp.float32),
            )
        ]
        program = jax.jit(functools.partial(speculative_accept, check_inputs="read"))
        start = time.perf_counter()
        program.lower(*args).compile()
        times[batch] = time.perf_counter() - start
    return times


def _shapes_of(batch, gamma, vocab, tree: bool):
    """Abstract arguments of an entry point (nothing allocated)."""
    f32, i32 = jnp.float32, jnp.int32
    rows = gamma + 1
    shapes = [
        ((batch, gamma), i32),
        ((batch, rows if tree else gamma, vocab), f32),
        ((batch, rows, vocab), f32),
        ((batch, gamma), f32),
        ((batch,), f32),
    ]
    if tree:  # node tokens, parents, then the rest
        shapes.insert(1, ((batch, gamma), i32))
    return [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]


def compile_table(shapes=((4, 4, 6), (64, 5, 128_256))) -> list[tuple]:
    """Seconds to lower and compile each entry point's program at each check level,
    with XLA's defaults and no persistent cache: `(entry point, shape, {level: s})`."""
    from benchmarks.contract_calls import accept_logits, tree_accept

    entries = [
        ("speculative_accept", speculative_accept, False),
        ("verify on Logits", accept_logits, False),
        ("verify on a tree", tree_accept, True),
    ]
    # The first compile of a process pays for XLA's own start-up: pay it here.
    jax.jit(lambda a: a + 1).lower(jnp.zeros(3)).compile()
    rows = []
    for name, entry, tree in entries:
        for shape in shapes:
            args = _shapes_of(*shape, tree)
            times = {}
            for level in ("off", "read", "all"):
                program = jax.jit(functools.partial(entry, check_inputs=level))
                start = time.perf_counter()
                program.lower(*args).compile()
                times[level] = time.perf_counter() - start
            rows.append((name, shape, times))
    return rows


def print_compile_table(rows):
    print("\nCompile time (seconds, lower and compile, XLA's defaults):\n")
    print("| entry point | B, G, V | off | read (default) | all | read / off |")
    print("|---|---|---|---|---|---|")
    for name, shape, t in rows:
        print(
            f"| {name} | {', '.join(map(str, shape))} | {t['off']:.2f} | "
            f"{t['read']:.2f} | {t['all']:.2f} | {t['read'] / t['off']:.1f}x |"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per impl")
    parser.add_argument(
        "--shapes",
        default=";".join(",".join(map(str, s)) for s in SHAPES),
        help="'B,G,V;B,G,V;...' (default: the serving shapes)",
    )
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")]
    with_torch = not args.no_torch
    if with_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("PyTorch not installed (pip install '.[bench]'): skipping it.\n")
            with_torch = False
    print_table(benchmark(shapes, args.repeats, with_torch))
    times = compile_seconds()
    print(
        "\nCompile time of the default entry point (G = 4, V = 1000): "
        + ", ".join(f"B = {b:,}: {t:.2f} s" for b, t in times.items())
    )
    print_compile_table(compile_table())


if __name__ == "__main__":
    main()
