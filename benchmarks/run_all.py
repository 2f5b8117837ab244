"""Every benchmark table in one command, written as Markdown:
`python benchmarks/run_all.py [--out FILE] [--quick]`.

Runs, each in its own process (so that each sets its own XLA flags), `bench.py` (the
verification step against its alternatives, the check levels, the compile times),
`bench_warps.py` (logits with serving warps), `bench_trees.py` (tree verification),
`bench_serving.py` (the serving options' cost) and,
where JAX sees 8 or more devices or runs on the CPU, `bench_sharding.py`. On whatever
backend JAX picks: on a GPU or TPU machine, this is the command that fills the
Performance page's accelerator column (under five minutes at the default sizes; PyTorch
rows run on the CPU, as the PyTorch implementations here are written). `--quick` runs
tiny shapes, to check that every script works.

The file starts with the platform (JAX's backend and devices, the versions) and the
exact commands, then each script's output as it printed it.
"""

import argparse
import datetime
import importlib.util
import pathlib
import platform
import subprocess
import sys
import time

import jax


HERE = pathlib.Path(__file__).resolve().parent

FULL = [
    ["bench.py", "--repeats", "20"],
    ["bench_warps.py", "--repeats", "5"],
    ["bench_trees.py"],
    ["bench_serving.py"],
    ["bench_sharding.py"],
]
QUICK = [
    ["bench.py", "--repeats", "3", "--shapes", "4,4,6;2,3,1000", "--no-torch"],
    ["bench_warps.py", "--repeats", "2", "--shapes", "2,3,1000"],
    [
        "bench_trees.py",
        "--batch",
        "2",
        "--vocab",
        "64",
        "--nodes",
        "16",
        "--repeats",
        "2",
    ],
    ["bench_serving.py", "--shape", "4,3,512", "--repeats", "2"],
    ["bench_sharding.py", "--batch", "8", "--vocab", "4096", "--repeats", "2"],
]


def _commands(quick: bool) -> list[list[str]]:
    commands = [list(c) for c in (QUICK if quick else FULL)]
    if importlib.util.find_spec("torch") is not None and not quick:
        commands[1].append("--torch")
    if jax.default_backend() != "cpu" and jax.device_count() < 8:
        commands = [c for c in commands if c[0] != "bench_sharding.py"]
    return commands


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python benchmarks/run_all.py", description=__doc__.splitlines()[0]
    )
    backend = jax.default_backend()
    parser.add_argument(
        "--out",
        default=str(HERE / f"results-{backend}.md"),
        help="the Markdown file to write (default: benchmarks/results-BACKEND.md)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny shapes, a smoke test"
    )
    args = parser.parse_args(argv)
    devices = ", ".join(str(d) for d in jax.devices())
    lines = [
        f"# Benchmarks on {backend.upper()}",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- devices: {devices}",
        f"- JAX {jax.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}",
        "",
    ]
    start = time.perf_counter()
    for command in _commands(args.quick):
        shown = "python benchmarks/" + " ".join(command)
        print(f"running: {shown}", file=sys.stderr, flush=True)
        began = time.perf_counter()
        done = subprocess.run(
            [sys.executable, str(HERE / command[0]), *command[1:]],
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - began
        lines += [f"## `{shown}`", "", f"({seconds:.0f} s)", ""]
        lines += [done.stdout.rstrip(), ""]
        if done.returncode != 0:
            lines += ["```text", done.stderr.rstrip()[-4000:], "```", ""]
            print(done.stderr, file=sys.stderr)
            pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
            raise SystemExit(f"{shown} failed (exit {done.returncode})")
    lines.append(f"All benchmarks in {time.perf_counter() - start:.0f} s.")
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
