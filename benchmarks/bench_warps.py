"""Benchmark of verification from logits with the warps serving stacks sample with:
`python benchmarks/bench_warps.py`.

For each shape (B, G, V), one interleaved run (medians, after compilation, every call
unchecked, `check_inputs="off"`, but one) of:

- `speculative_accept` on probabilities (it reads two of the 2G + 1 rows in full);
  the draft tokens are drawn from the draft at temperature 0.7, as a drafter draws them
  (the table gives the mean number accepted), since the logits path normalises rows
  only up to the first rejection;
- `verify` on `Logits` with the same warp on both sides: temperature 0.7 alone,
  then with top-k 50, top-p 0.9 and min-p 0.05; temperature 0.7 with the default checks
  on, and on the same logits in bfloat16;
- the straightforward JAX version of each warp, as a JAX user writes it without the
  library's logits path: both sides warped in `jax.numpy` (`jax.nn.softmax` of the
  tempered rows; top-k by `jax.lax.top_k`; top-p by a sort and a cumulative sum; min-p
  against the row maximum), then `speculative_accept` on the probabilities, in one
  `jax.jit`;
- with `--torch` (needs the `bench` extra), PyTorch warps of the same rows, written as
  vLLM's and Hugging Face's samplers write them on the CPU: temperature softmax, top-k by
  `torch.topk`, top-p by a sort and a cumulative sum. They warp only, without verifying,
  so a ratio above 1 means the library verifies faster than PyTorch merely warps.

It prints milliseconds per call and the ratios the performance goals are stated in.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.contract_calls import accept_logits
from eqx_specdec import speculative_accept, Warp


SHAPES = [(16, 5, 32_000), (64, 5, 128_256), (256, 8, 32_000)]
WARPS = {
    "temperature 0.7": Warp(0.7),
    "top-k 50": Warp(0.7, top_k=50),
    "top-p 0.9": Warp(0.7, top_p=0.9),
    "min-p 0.05": Warp(0.7, min_p=0.05),
}
BF16 = "temperature 0.7, bfloat16 logits"
CHECKED = "temperature 0.7, default checks"
# The straightforward JAX version of each warp (its name: "JAX " + the warp's).
JAX = "JAX "


def _inputs(seed, batch, gamma, vocab):
    rng = np.random.default_rng(seed)
    target = rng.standard_normal((batch, gamma + 1, vocab), dtype=np.float32) * 3
    draft = target[:, :gamma] + rng.standard_normal((batch, gamma, vocab), np.float32)
    # Drawn from the draft at temperature 0.7 (Gumbel-max), as a drafter draws them:
    # about 55% of the draft tokens pass at this noise.
    gumbel = -np.log(-np.log(rng.random(draft.shape, dtype=np.float32) + 1e-20))
    tokens = np.argmax(draft / 0.7 + gumbel, axis=-1).astype(np.int32)
    accept = rng.random((batch, gamma), dtype=np.float32)
    sample = rng.random(batch, dtype=np.float32)
    return tokens, draft, target, accept, sample


def _jax_warps():
    """Each warp as a JAX user writes it in `jax.numpy`, at temperature 0.7, from a
    row's logits to its probabilities. (Ties at a cut-off are kept, and top-p keeps the
    smallest prefix of the sorted row whose mass reaches 0.9.)"""

    def temperature(x):
        return jax.nn.softmax(x / 0.7, axis=-1)

    def top_k(x):
        x = x / 0.7
        kth = jax.lax.top_k(x, 50)[0][..., -1:]
        return jax.nn.softmax(jnp.where(x < kth, -jnp.inf, x), axis=-1)

    def top_p(x):
        x = x / 0.7
        values = -jnp.sort(-x, axis=-1)  # descending
        probs = jax.nn.softmax(values, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs
        cut = jnp.min(jnp.where(before < 0.9, values, jnp.inf), -1, keepdims=True)
        return jax.nn.softmax(jnp.where(x < cut, -jnp.inf, x), axis=-1)

    def min_p(x):
        x = x / 0.7
        cut = jnp.max(x, axis=-1, keepdims=True) + jnp.log(0.05)
        return jax.nn.softmax(jnp.where(x < cut, -jnp.inf, x), axis=-1)

    warps = dict(zip(WARPS, (temperature, top_k, top_p, min_p)))

    def verify(warp):
        @jax.jit
        def call(x, draft_logits, target_logits, u, s):
            q, p = warp(draft_logits), warp(target_logits)
            return speculative_accept(x, q, p, u, s, check_inputs="off")

        return call

    return {JAX + name: verify(warp) for name, warp in warps.items()}


def _as_probs(logits):
    return np.asarray(jax.nn.softmax(jnp.asarray(logits), axis=-1))


def _torch_warps():
    import torch

    def temperature(draft, target):
        return [torch.softmax(x / 0.7, dim=-1) for x in (draft, target)]

    def top_k(draft, target):
        out = []
        for x in (draft, target):
            x = x / 0.7
            kth = torch.topk(x, 50, dim=-1).values[..., -1:]
            out.append(torch.softmax(x.masked_fill(x < kth, -float("inf")), dim=-1))
        return out

    def top_p(draft, target):
        out = []
        for x in (draft, target):
            x = x / 0.7
            values, order = torch.sort(x, dim=-1, descending=True)
            probs = torch.softmax(values, dim=-1)
            before = torch.cumsum(probs, dim=-1) - probs
            values = values.masked_fill(before >= 0.9, -float("inf"))
            x = torch.empty_like(x).scatter_(-1, order, values)
            out.append(torch.softmax(x, dim=-1))
        return out

    return {
        "PyTorch temperature": torch.no_grad()(temperature),
        "PyTorch top-k 50": torch.no_grad()(top_k),
        "PyTorch top-p 0.9": torch.no_grad()(top_p),
    }


def benchmark(shapes, repeats: int, with_torch: bool) -> list[dict]:
    impls = {
        "probabilities": lambda x, q, p, u, s, *_: speculative_accept(
            x, q, p, u, s, check_inputs="off"
        )
    }
    for name, warp in WARPS.items():
        impls[name] = lambda x, q, p, u, s, dl, tl, *_, w=warp: accept_logits(
            x, dl, tl, u, s, target_warp=w, draft_warp=w, check_inputs="off"
        )
    for name, fn in _jax_warps().items():
        impls[name] = lambda x, q, p, u, s, dl, tl, *_, fn=fn: fn(x, dl, tl, u, s)
    impls[CHECKED] = lambda x, q, p, u, s, dl, tl, *_: accept_logits(
        x, dl, tl, u, s, target_warp=Warp(0.7), draft_warp=Warp(0.7)
    )
    impls[BF16] = lambda x, q, p, u, s, dl, tl, dl16, tl16: accept_logits(
        x,
        dl16,
        tl16,
        u,
        s,
        target_warp=Warp(0.7),
        draft_warp=Warp(0.7),
        check_inputs="off",
    )
    if with_torch:
        for name, fn in _torch_warps().items():
            impls[name] = lambda *args, fn=fn: fn(*args)
    rows = []
    for batch, gamma, vocab in shapes:
        copies = 2
        device, host_torch = [], []
        for seed in range(copies):
            x, dl, tl, u, s = _inputs(seed, batch, gamma, vocab)
            q, p = _as_probs(dl), _as_probs(tl)
            arrays = tuple(jnp.asarray(a) for a in (x, q, p, u, s, dl, tl))
            halves = tuple(jnp.asarray(a, jnp.bfloat16) for a in (dl, tl))
            device.append(arrays + halves)
            if with_torch:
                import torch

                host_torch.append((torch.from_numpy(dl), torch.from_numpy(tl)))

        def call(name, r):
            torch_call = name.startswith("PyTorch")
            out = impls[name](*(host_torch if torch_call else device)[r % copies])
            if not torch_call:
                jax.block_until_ready(out)

        times = {name: [] for name in impls}
        for name in impls:  # compile, and warm PyTorch up
            call(name, 0)
        accepted = impls["temperature 0.7"](*device[0])["num_accepted"]
        # The straightforward versions compute the same verification: the share of the
        # emitted slots where their tokens equal ours (floating-point rounding of the
        # normalisers could flip a token exactly at a cut-off or a uniform's edge).
        same = min(
            float(
                np.mean(
                    np.asarray(impls[JAX + name](*device[0])["tokens"])
                    == np.asarray(impls[name](*device[0])["tokens"])
                )
            )
            for name in WARPS
        )
        names = list(impls)
        for r in range(repeats):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                call(name, r)
                times[name].append(time.perf_counter() - start)
        rows.append(
            {
                "shape": (batch, gamma, vocab),
                "accepted": float(jnp.mean(accepted)),
                "same tokens": same,
                **{k: statistics.median(v) for k, v in times.items()},
            }
        )
    return rows


def print_table(rows, with_torch: bool):
    print(
        "Milliseconds per call (medians), and ratios. Every call unchecked but the default "
        "checks column; the same "
        "warp on both sides.\n"
    )
    head = ["B, G, V", "probabilities"] + list(WARPS) + ["accepted (mean, temp. 0.7)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        cells = [", ".join(map(str, row["shape"]))]
        cells += [f"{row[name] * 1e3:.1f}" for name in ["probabilities"] + list(WARPS)]
        cells += [f"{row['accepted']:.2f}"]
        print("| " + " | ".join(cells) + " |")
    print()
    head = ["B, G, V", "temperature / probabilities"]
    head += [f"{name} / temperature" for name in list(WARPS)[1:]]
    head += ["default checks / unchecked"]
    head += ["bfloat16 / float32 logits"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        t = row["temperature 0.7"]
        cells = [", ".join(map(str, row["shape"])), f"{t / row['probabilities']:.1f}x"]
        cells += [f"{row[name] / t:.2f}x" for name in list(WARPS)[1:]]
        cells += [f"{row[name] / t:.2f}x" for name in [CHECKED, BF16]]
        print("| " + " | ".join(cells) + " |")
    print()
    print(
        "The straightforward JAX version (the warp in jax.numpy, then "
        "speculative_accept, one jax.jit) / ours:"
    )
    print()
    _print_against(rows, [(JAX + name, name) for name in WARPS])
    print()
    same = ", ".join(f"{row['same tokens']:.4f}" for row in rows)
    print(
        "Their tokens equal ours in this share of the slots (the lowest over the warps, "
        f"at each shape): {same}."
    )
    if not with_torch:
        return
    print()
    print(
        "PyTorch warping the same rows (without verifying) / ours warping and verifying:"
    )
    print()
    pairs = [
        ("PyTorch temperature", "temperature 0.7"),
        ("PyTorch top-k 50", "top-k 50"),
        ("PyTorch top-p 0.9", "top-p 0.9"),
    ]
    _print_against(rows, pairs)


def _print_against(rows, pairs):
    """A table of the baselines' milliseconds and their ratios to ours, a column for
    each (baseline, ours) pair."""
    head = ["B, G, V"] + [f"{theirs} (ms) / ours" for theirs, _ in pairs]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        cells = [", ".join(map(str, row["shape"]))]
        cells += [
            f"{row[theirs] * 1e3:.0f} / {row[theirs] / row[ours]:.1f}x"
            for theirs, ours in pairs
        ]
        print("| " + " | ".join(cells) + " |")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per impl")
    parser.add_argument(
        "--shapes", default=None, help="'B,G,V;B,G,V;...' (default: serving shapes)"
    )
    parser.add_argument("--torch", action="store_true", help="time PyTorch's warps too")
    args = parser.parse_args(argv)
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")]
    print(f"JAX {jax.__version__} on {jax.default_backend()}")
    print_table(benchmark(shapes, args.repeats, args.torch), args.torch)


if __name__ == "__main__":
    main()
