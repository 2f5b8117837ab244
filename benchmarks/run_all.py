"""Every benchmark table in one command, written as Markdown:
`python benchmarks/run_all.py [--out FILE] [--quick]`.

This is the one source of the project's speed story. It runs, each in its own process (so
that each sets its own XLA flags), `bench.py` (the verification step against its
alternatives, the check levels, the compile times), `bench_warps.py` (logits with serving
warps), `bench_trees.py` (tree verification), `bench_serving.py` (the serving options'
cost), `bench_memory.py` (compiled temporaries against inputs), `bench_decoding.py`
(speculative decoding's wall-clock speed-up), `bench_llm.py` (a real model,
SmolLM2-135M, by prompt category; needs the `[llm]` extra) and, where JAX sees 8 or more devices or
runs on the CPU, `bench_sharding.py`; on the CPU, `bench_xla_cpu.py` (what XLA CPU
does with the logits path's passes); `hlo_passes.py` (the operations of each warp's
compiled program that read whole rows); then times the README's demo. On whatever backend
JAX picks: on a GPU or TPU machine, this is the command that fills an accelerator's results
(PyTorch rows run on the CPU, as the PyTorch implementations here are written).
`--quick` runs tiny shapes, to check that every script works, and writes nothing but
`--out`.

The file starts with the machine (processor, cores, memory, JAX's devices, the versions)
and the date, then each script's output as it printed it, each in a section that the
Performance page includes (`--8<-- "benchmarks/results-cpu.md:bench"`). Last comes the
one-sentence claim (section `claim`) that the docs' home page includes, computed from the
tables above it, so that no page quotes a number the tables do not show.
"""

import argparse
import datetime
import importlib.metadata
import importlib.util
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time

import jax


HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import story  # noqa: E402


# (section, script and arguments): each script's output lands in its own section.
FULL = [
    ("bench", ["bench.py", "--repeats", "20"]),
    ("warps", ["bench_warps.py", "--repeats", "5"]),
    ("trees", ["bench_trees.py"]),
    ("serving", ["bench_serving.py"]),
    ("memory", ["bench_memory.py"]),
    ("decoding", ["bench_decoding.py"]),
    ("llm", ["bench_llm.py"]),
    ("sharding", ["bench_sharding.py"]),
    ("cutoffs", ["bench_cutoffs.py"]),
    ("xla", ["bench_xla_cpu.py"]),
    ("passes", ["hlo_passes.py"]),
]
QUICK = [
    ("bench", ["bench.py", "--repeats", "3", "--shapes", "4,4,6;2,3,1000", "--no-torch"]),
    ("warps", ["bench_warps.py", "--repeats", "2", "--shapes", "2,3,1000"]),
    ("trees", ["bench_trees.py", "--batch", "2", "--vocab", "64", "--nodes", "16",
               "--repeats", "2"]),
    ("serving", ["bench_serving.py", "--shape", "4,3,512", "--repeats", "2"]),
    ("memory", ["bench_memory.py", "--shape", "4,3,512"]),
    ("decoding", ["bench_decoding.py", "--batch", "1", "--tokens", "8", "--repeats", "1"]),
    ("llm", ["bench_llm.py", "--batches", "1", "--prompts", "1", "--categories",
             "summarise", "--tokens", "16", "--repeats", "1"]),
    ("sharding", ["bench_sharding.py", "--batch", "8", "--vocab", "4096", "--repeats", "2"]),
    ("cutoffs", ["bench_cutoffs.py", "--rows", "4,16384", "--repeats", "2"]),
    ("xla", ["bench_xla_cpu.py", "--shape", "2,3,1024", "--repeats", "2"]),
    ("passes", ["hlo_passes.py", "--shape", "2,3,4096"]),
]  # fmt: skip


def _commands(quick: bool) -> list[tuple[str, list[str]]]:
    commands = [(name, list(c)) for name, c in (QUICK if quick else FULL)]
    if importlib.util.find_spec("torch") is not None and not quick:
        dict(commands)["warps"].append("--torch")
    if importlib.util.find_spec("gguf") is None:  # the [llm] extra is not installed
        commands = [c for c in commands if c[0] != "llm"]
    if jax.default_backend() != "cpu" and jax.device_count() < 8:
        commands = [c for c in commands if c[0] != "sharding"]
    if jax.default_backend() != "cpu":  # XLA CPU's own behaviour
        commands = [c for c in commands if c[0] != "xla"]
    return commands


def machine() -> str:
    """The processor, its cores and the memory, in words."""
    cpu, memory = platform.processor() or platform.machine(), None
    cpuinfo, meminfo = pathlib.Path("/proc/cpuinfo"), pathlib.Path("/proc/meminfo")
    if cpuinfo.is_file():
        names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M)
        cpu = names[0] if names else cpu
    if meminfo.is_file():
        kib = int(re.search(r"MemTotal:\s*(\d+)", meminfo.read_text()).group(1))
        memory = f"{kib / 2**20:.0f} GiB"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    cores = cores or os.cpu_count()
    return f"a {cores}-core CPU ({cpu}" + (f", {memory})" if memory else ")")


def _section(name: str, body: list[str]) -> list[str]:
    return [
        f"<!-- --8<-- [start:{name}] -->",
        *body,
        f"<!-- --8<-- [end:{name}] -->",
        "",
    ]


def _run(command: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return done, time.perf_counter() - began


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python benchmarks/run_all.py", description=__doc__.splitlines()[0]
    )
    backend = jax.default_backend()
    parser.add_argument(
        "--out",
        default=None,
        help="the Markdown file to write (default: benchmarks/results-BACKEND.md, or "
        "a temporary file with --quick)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny shapes, a smoke test"
    )
    args = parser.parse_args(argv)
    devices = ", ".join(str(d) for d in jax.devices())
    torch = importlib.util.find_spec("torch")
    versions = f"JAX {jax.__version__}, Python {platform.python_version()}"
    if torch is not None:
        versions += f", PyTorch {importlib.metadata.version('torch')}"
    lines = [f"# Benchmarks on {backend.upper()}", ""]
    lines += _section(
        "machine",
        [
            f"- machine: {machine()}",
            f"- devices: {devices}",
            f"- {versions}",
            f"- date: {datetime.date.today().isoformat()}",
            "- command: `python benchmarks/run_all.py`",
        ],
    )
    if args.out is not None:
        out = pathlib.Path(args.out)
    elif args.quick:
        out = pathlib.Path(tempfile.gettempdir()) / f"results-{backend}-quick.md"
    else:
        out = HERE / f"results-{backend}.md"
    start = time.perf_counter()
    for name, command in _commands(args.quick):
        shown = "python benchmarks/" + " ".join(command)
        print(f"running: {shown}", file=sys.stderr, flush=True)
        done, seconds = _run([sys.executable, str(HERE / command[0]), *command[1:]])
        lines += [f"## `{shown}`", "", f"({seconds:.0f} s)", ""]
        lines += _section(name, [done.stdout.rstrip()])
        if done.returncode != 0:
            lines += ["```text", done.stderr.rstrip()[-4000:], "```", ""]
            print(done.stderr, file=sys.stderr)
            out.write_text("\n".join(lines) + "\n")
            raise SystemExit(f"{shown} failed (exit {done.returncode})")
    if not args.quick:
        # The README's first command, timed as a new user runs it.
        print("running: python -m eqx_specdec demo", file=sys.stderr, flush=True)
        done, seconds = _run([sys.executable, "-m", "eqx_specdec", "demo"])
        if done.returncode != 0:
            raise SystemExit(f"the demo failed:\n{done.stderr[-4000:]}")
        demo = f"`python -m eqx_specdec demo` (the README's first command): {seconds:.1f} s."
        lines += ["## The demo", ""] + _section("demo", [demo])
        try:
            sentence = story.claim("\n".join(lines))
        except ValueError as error:  # no PyTorch column: no comparison to claim
            sentence = f"No claim: {error}."
        lines += ["## The claim", ""] + _section("claim", [sentence])
    lines.append(f"All benchmarks in {time.perf_counter() - start:.0f} s.")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
