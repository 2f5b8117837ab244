import gc
import os


# XLA flags, set before JAX starts its backend:
# - eight host CPU devices, for the sharding tests (the other tests run on the default
#   device);
# - quick compilation: most of the suite's time is XLA compiling small programs. XLA
#   CPU's classic emitters (not the new fusion emitters), and LLVM without its
#   optimisation passes (`jax_disable_most_optimizations`, below), compile them in about
#   a third of the time. (One LLVM module a program,
#   `xla_cpu_parallel_codegen_split_count=1`, compiled a lone program a tenth faster but
#   made the suite's 32-bit pass take 521 s against 455 s: a worker's parallel code
#   generation uses the core the other worker leaves idle while it traces.) The programs
#   compute the same values (no fast math either way) and run up to a few times slower,
#   which most of the suite's small cases do not notice; the tests whose time is
#   running, not compiling, are marked `execution_bound` and compile with full
#   optimisation. Bit-for-bit comparisons are between programs compiled alike. What runs
#   as a user runs it compiles with XLA's defaults: the demo in CI, the benchmarks, and
#   the tests' subprocesses (`helpers.default_xla_environment`: the console script, the
#   draft-training example). `SPECDEC_TEST_XLA_DEFAULTS=1` runs the whole suite with
#   XLA's defaults.
QUICK_COMPILE = os.environ.get("SPECDEC_TEST_XLA_DEFAULTS") != "1"
TEST_XLA_FLAGS = {"xla_force_host_platform_device_count": "8"}
if QUICK_COMPILE:
    TEST_XLA_FLAGS["xla_cpu_use_fusion_emitters"] = "false"
_flags = os.environ.get("XLA_FLAGS", "")
for _name, _value in TEST_XLA_FLAGS.items():
    if _name not in _flags:
        _flags += f" --{_name}={_value}"
os.environ["XLA_FLAGS"] = _flags.strip()
# LLVM without its optimisation passes (XLA's `xla_backend_optimization_level=0` and no
# expensive passes), read by JAX when it is imported, and by the subprocesses that keep
# the suite's settings; the tests marked `execution_bound` turn it off (the fixture below).
os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1" if QUICK_COMPILE else "0"


import jax  # noqa: E402
import pytest  # noqa: E402
from jax._src import dispatch  # noqa: E402

from eqx_specdec.llm._fetch import cache_dir  # noqa: E402


# XLA's persistent cache: a later run on the same machine reads its programs instead of
# compiling them (most of the suite's time is compilation). A cold run gains little: the
# suite compiles nearly every program once (in a cold 32-bit pass the cache served 29 of
# 7,408 compilations; two modules took as long without it). JAX keys entries by
# program, flags and devices. It lives in the library's cache beside the fetched model
# (`$EQX_SPECDEC_CACHE`, else `$XDG_CACHE_HOME/eqx_specdec`, else
# `~/.cache/eqx_specdec`), not in the checkout. Programs that compile in under 0.1 s are
# not stored: writing and reading thousands of them cost more than compiling them again.
COMPILATION_CACHE = str(cache_dir() / "jax-compilation-cache")
jax.config.update("jax_compilation_cache_dir", COMPILATION_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# No Python tracebacks in the programs' debug locations (JAX's default keeps up to 100
# frames per operation): they only name source lines in XLA dumps and profiles, and
# carrying them costs about a tenth of the suite's lowering and compile time.
jax.config.update("jax_include_full_tracebacks_in_locations", False)
jax.config.update("jax_traceback_in_locations_limit", 0)


# Strict promotion catches silent dtype and rank mixing (int64 with int32, float64 with
# float32) in the library. `JAX_ENABLE_X64` chooses the mode; CI runs both.
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(autouse=True)
def _clear_provoked_callback_errors():
    """JAX keeps the error of a failed callback of a caller's jitted program in its
    runtime tokens and raises it again at the next `jax.effects_barrier()` (and at exit),
    until another effectful program runs. The tests that provoke the library's check error
    inside a jit of their own have already asserted it: clear it after them, so that it
    cannot surface in a later test. Any other error still fails the test."""
    yield
    try:
        jax.effects_barrier()
    except jax.errors.JaxRuntimeError as error:
        if "(the first such row)" not in str(error):
            raise
        dispatch.runtime_tokens.clear()


def _mapping_limit() -> int | None:
    """The kernel's cap on a process's memory mappings (Linux), or `None`."""
    try:
        with open("/proc/sys/vm/max_map_count") as file:
            return int(file.read())
    except (OSError, ValueError):
        return None


def _mappings() -> int:
    with open("/proc/self/maps", "rb") as file:
        return sum(1 for _ in file)


MAPPING_LIMIT = _mapping_limit()
_tests_since_count = 0


@pytest.fixture(autouse=True)
def _release_compiled_programs():
    """XLA CPU maps each compiled kernel's code and data into the process (about three
    mappings a kernel, 150 to 250 for one verification's programs), and JAX keeps every
    program a test compiled. A worker of this suite reached Linux's cap of 65,530
    mappings about half way through a pass, and XLA crashed with a segmentation fault
    in the next compilation. Every fifth test, when the worker holds more than half the
    cap, JAX's caches are cleared (the programs are freed, and later tests that need
    one again read it from the persistent cache or compile it again)."""
    global _tests_since_count
    yield
    if MAPPING_LIMIT is None:
        return
    _tests_since_count += 1
    if _tests_since_count < 5:
        return
    _tests_since_count = 0
    if _mappings() > MAPPING_LIMIT // 2:
        jax.clear_caches()
        gc.collect()


@pytest.fixture(autouse=True)
def _optimise_execution_bound(request):
    """A test marked `execution_bound` (large Monte Carlo runs, big quadrature grids:
    seconds of running against a fraction of a second of compiling) compiles its
    programs with XLA's full optimisation, which runs them about twice as fast. JAX reads
    the setting at each compilation; programs compiled earlier are reused as they are."""
    if not QUICK_COMPILE or request.node.get_closest_marker("execution_bound") is None:
        yield
        return
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", True)


# The two passes: CI runs the suite in 32-bit JAX (the default) and again in 64-bit JAX
# (`JAX_ENABLE_X64=1`). What the 64-bit mode changes is dtypes: inputs built with the
# default dtypes are float64 and int64, float64 inputs exist at all, and strict
# promotion (above) checks them against the library's float32 and int32 arithmetic. The
# 64-bit pass runs the modules whose subject is that: every entry point on every dtype
# (the fuzz suite draws float64 too), the reference and edge cases, the checks and
# errors, the transforms, batch invariance, the warps, serving options and the decoding
# loop through them (`X64_MODULES`). The other modules check properties no dtype enters
# (layouts across devices, tracing and Equinox's filter semantics, the CLI, the docs'
# snippets, the structure, statistics of loops over float32 models) and run in the
# 32-bit pass only: run twice, the suite's compile time did not fit CI's ten minutes on
# two cores. Within those modules, a test marked `dtype_free` (a hang, a Monte Carlo
# statistic on float32 inputs, per-row seeds: nothing a dtype enters) runs in the 32-bit
# pass only. `SPECDEC_X64_ALL=1` runs every test in the 64-bit pass too.
X64_MODULES = {
    "test_check_levels.py",
    "test_edge_cases.py",
    "test_errors.py",
    "test_fuzz.py",
    "test_invariance.py",
    "test_objectives.py",
    "test_reference.py",
    "test_serving.py",
    "test_stages.py",
    "test_transforms.py",
    "test_verify.py",
    "test_warp_search.py",
}


def pytest_collection_modifyitems(config, items):
    if not jax.config.jax_enable_x64 or os.environ.get("SPECDEC_X64_ALL") == "1":
        return

    def in_x64_pass(item):
        return (
            item.path.name in X64_MODULES
            and item.get_closest_marker("dtype_free") is None
        )

    selected = [item for item in items if in_x64_pass(item)]
    deselected = [item for item in items if not in_x64_pass(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
