"""The command line: `demo`, `evaluate`, help and errors."""

import importlib.metadata
import io
import json
import subprocess
import sys

import pytest
from helpers import default_xla_environment

from eqx_specdec._cli import demo as _cli_demo, main as _cli
from eqx_specdec._cli.chat import timing_rows


def _run(argv, capsys):
    _cli.main(argv)
    return capsys.readouterr().out


def test_the_quick_demo_runs_its_verifiers_and_no_policy_table(capsys):
    _cli.main(["demo", "--batch", "2", "--tokens", "8", "--no-timing"])
    out, err = capsys.readouterr()
    # Progress while it compiles, one line per task off a terminal, numbered as they
    # start (on two threads, in either order).
    count = len(_cli.DEMO_QUICK)
    lines = err.splitlines()
    assert [line.split("]")[0] for line in lines] == [
        f"[{i + 1}/{count}" for i in range(count)
    ]
    assert sorted(line.split("] ")[1] for line in lines) == sorted(
        f"{name}..." for name in _cli.DEMO_QUICK
    )
    rows = {line.split("|")[1].strip() for line in out.splitlines() if line[:2] == "| "}
    assert set(_cli.DEMO_QUICK) <= rows and "traversal" not in rows
    assert "draft length (standard rule)" not in out


def test_the_bare_command_prints_its_usage_then_the_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli.main([])
    assert exit_info.value.code == 2
    *usage, error = capsys.readouterr().err.splitlines()  # usage may wrap
    usage = " ".join(usage)
    assert usage.startswith("usage: eqx-specdec ") and "demo" in usage
    assert error.startswith("eqx-specdec: error: the following arguments are required")


def test_demo_prints_the_table_and_writes_the_figure(tmp_path, capsys):
    figure = tmp_path / "demo.png"
    out = _run(
        [
            "demo",
            "--batch",
            "8",
            "--tokens",
            "48",
            "--gamma",
            "3",
            "--draft-lengths",
            "fixed-2,confidence-0.5",
            "--verifiers",
            "standard,block,greedy",  # every family decodes in test_decoding.py
            "--plot",
            str(figure),
            "--no-timing",  # timed in test_cached_models.py, on small models
        ],
        capsys,
    )
    assert "Samples (standard):" in out
    header = "| verifier | drafts | tokens per target call | theory |"
    assert header in out
    rows = {
        line.split("|")[1].strip(): line
        for line in out.splitlines()
        if line.startswith("| ")
    }
    for name in ("standard", "block", "greedy"):
        assert name in rows
    cells = rows["standard"].split("|")
    observed, theory = float(cells[3]), float(cells[4])
    assert 1.0 < observed < 4.0 and abs(observed - theory) < 0.3
    assert ">= " in rows["block"]
    assert (
        "greedy speculative decoding equals greedy decoding of the target: yes" in out
    )
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| draft length (standard rule) | tokens per target call |" in out
    fixed, stopped = rows["fixed-2"].split("|"), rows["confidence-0.5"].split("|")
    assert float(fixed[5]) == 2.0 and 1.0 <= float(stopped[5]) <= 8.0
    assert abs(float(fixed[2]) - float(fixed[3])) < 0.3  # measured against theory


def test_demo_without_matplotlib_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(
            ["demo", "--batch", "2", "--tokens", "8", "--verifiers", "standard",
             "--plot", str(tmp_path / "x.png")]
        )  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # one line, before any work
    assert err.startswith("eqx-specdec demo: error: argument --plot: needs matplotlib")
    assert 'python -m pip install ".[plot]"' in err


@pytest.mark.parametrize(
    "verifier, lossless",
    [("standard", True),
     pytest.param("block", True, marks=pytest.mark.execution_bound),
     ("one-hot", True), ("greedy", True), ("lenient", False),
     ("typical-sampled", False)],
)  # fmt: skip
def test_evaluate_by_quadrature(verifier, lossless, capsys):
    out = _run(["evaluate", "--verifier", verifier, "--json"], capsys)
    result = json.loads(out)
    assert result["method"] == "quadrature"
    assert (result["distance"] < 1e-6) == lossless
    assert 0 <= result["acceptance_rate"] <= 1
    assert result["tokens_per_step"] == pytest.approx(1 + sum(result["reached"][1:]))


def test_evaluate_by_monte_carlo(capsys):
    out = _run(
        ["evaluate", "--verifier", "gumbel", "--case", "flat", "--vocab", "64",
         "--method", "monte-carlo", "--draws", "50000", "--json"],
        capsys,
    )  # fmt: skip
    result = json.loads(out)
    assert result["method"] == "monte-carlo" and result["draws"] == 50000
    assert result["chi_square"]["passed"] is True
    lossy = json.loads(
        _run(
            ["evaluate", "--verifier", "lenient", "--lenience", "0.3", "--case", "flat",
             "--vocab", "64", "--method", "monte-carlo", "--draws", "50000", "--json"],
            capsys,
        )
    )  # fmt: skip
    assert lossy["chi_square"]["passed"] is False
    text = _run(
        ["evaluate", "--case", "ngram", "--method", "monte-carlo", "--draws", "20000"],
        capsys,
    )
    assert "Monte Carlo, 20000 draws" in text and "(consistent with the target)" in text
    # Beyond quadrature's reach, a threshold rule is evaluated exactly, in closed form.
    exact = json.loads(_run(["evaluate", "--case", "ngram", "--json"], capsys))
    assert exact["method"] == "closed-form" and exact["distance"] < 1e-6


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["demo", "--verifiers", "standard,fancy"],
            "unknown verifier(s) fancy; choose",
        ),
        (["demo", "--verifiers", "standard,,block"], "--verifiers: empty name in"),
        (
            ["demo", "--plot", "/no/such/dir/x.png"],
            "--plot: the directory '/no/such/dir'",
        ),
        (
            ["demo", "--plot", "x.txt"],
            "--plot: 'x.txt' has no image suffix; use one of",
        ),
        (
            ["demo", "--draft-lengths", "fixed-2,oracle-1.5"],
            "--draft-lengths: unknown policy oracle-1.5; give fixed-G",
        ),
        (["demo", "--batch", "0"], "must be positive"),
        (["demo", "--lenience", "2"], "must lie in (0, 1]"),
        (["evaluate", "--verifier", "fancy"], "invalid choice: 'fancy'"),
        (["evaluate", "--method", "quadrature", "--vocab", "100"], "V^G = 100^2 > 256"),
        (
            ["evaluate", "--method", "quadrature", "--verifier", "gumbel"],
            "GumbelSampler does not implement `quadrature_breakpoints`",
        ),
    ],
)
def test_errors_are_clear(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.err.count("\n") == 1  # one line, no usage block
    command = argv[0] if argv else ""
    assert captured.err.startswith(f"eqx-specdec {command}".strip() + ": error: ")
    assert captured.out == ""  # refused before any work


@pytest.mark.parametrize(
    "argv, first_line",
    [
        (
            ["chat", "--temprature", "0.7", "Tell me a joke."],
            "eqx-specdec chat: error: unknown option --temprature; did you mean "
            "--temperature?",
        ),
        (
            ["demo", "--batch", "2", "--tokns=3"],
            "eqx-specdec demo: error: unknown option --tokns; did you mean --tokens?",
        ),
        (["demo", "--xyz"], "eqx-specdec demo: error: unknown option --xyz;"),
        (["--verison"], "eqx-specdec: error: unknown option --verison; did you mean "),
    ],
)
def test_a_mistyped_option_is_named_with_the_closest_and_the_usage(
    argv, first_line, capsys
):
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(argv)
    assert exit_info.value.code == 2
    error, *usage = capsys.readouterr().err.splitlines()
    assert error.startswith(first_line)
    assert "Tell me" not in error  # the words after it are not the mistake
    command = "" if argv[0].startswith("-") else f"{argv[0]} "
    assert usage[0].startswith(f"usage: eqx-specdec {command}")


@pytest.mark.parametrize("argv", [["chat", ""], ["chat", "  "], ["chat", "Tell", "me"]])
def test_chat_refuses_an_empty_or_unquoted_prompt_before_any_work(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("eqx-specdec chat: error: ")
    assert captured.err.count("\n") == 1 and captured.out == ""


def test_the_chat_timing_table_adds_up():
    """Tokens per second is the tokens over the median seconds; the speed-up the median
    of the runs' ratios, with their least and greatest."""
    rows = dict(timing_rows(40, [1.0, 2.0, 4.0], [0.5, 1.0, 1.0]))
    assert rows["plain decoding"] == "2.00 s, 20.0 tokens/s"
    assert rows["speculative decoding"] == "1.00 s, 40.0 tokens/s"
    assert rows["speed-up (wall clock)"] == "2.00x (from 2.00x to 4.00x over 3 runs)"


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["--version"])
    assert exit_info.value.code == 0
    version = importlib.metadata.version("eqx_specdec")
    assert capsys.readouterr().out == f"eqx-specdec {version}\n"


def test_help_never_breaks_a_name_at_its_hyphen(capsys):
    with pytest.raises(SystemExit):
        _cli.main(["demo", "--help"])
    out = capsys.readouterr().out
    assert "one-\n" not in out and "one-hot" in out


def test_json_floats_are_rounded(capsys):
    result = json.loads(_run(["evaluate", "--json"], capsys))

    def floats(value):
        if isinstance(value, float):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from floats(v)
        elif isinstance(value, list):
            for v in value:
                yield from floats(v)

    found = list(floats(result))
    assert found  # distances, rates, tokens per step
    for x in found:
        assert x == float(f"{x:.12g}"), x  # at most 12 significant digits


@pytest.mark.parametrize("command", ["demo", "evaluate"])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli.main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: eqx-specdec {command}" in out
    assert "--seed" in out


def test_progress_bar_draws_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    bar = _cli_demo.ProgressBar(2, stream)
    bar.start("standard")
    bar.update(50, 100)
    bar.finish_task()
    bar.start("block")
    bar.update(100, 100)
    text = stream.getvalue()
    assert "25.0%  standard" in text and "100.0%  block" in text
    quiet = io.StringIO()
    _cli_demo.ProgressBar(1, quiet).update(1, 2)
    assert quiet.getvalue() == ""


def test_module_and_console_script():
    (script,) = importlib.metadata.entry_points(
        group="console_scripts", name="eqx-specdec"
    )
    assert script.load() is _cli.main
    # With XLA's default flags (the suite compiles quickly, `conftest.py`): what a user
    # runs.
    done = subprocess.run(
        [sys.executable, "-m", "eqx_specdec", "evaluate", "--json"],
        capture_output=True,
        text=True,
        check=True,
        env=default_xla_environment(),
    )
    assert json.loads(done.stdout)["verifier"] == "standard"


def test_the_demo_models_have_no_side_effects(tmp_path, monkeypatch):
    """Loading never trains (missing weights are an error naming the command that
    writes them), and nothing is written inside the package unless its directory is
    named: the training command requires `--out`."""
    from eqx_specdec.demo import _training

    monkeypatch.setattr(_training, "_data_dir", lambda: tmp_path)
    _training.builtin_transformers.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="train-transformers --out"):
            _training.builtin_transformers()
    finally:
        _training.builtin_transformers.cache_clear()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError, match="`directory`"):
        _training.write_builtin_transformers(None)
    with pytest.raises(SystemExit):  # argparse: --out is required
        _cli.main(["train-transformers"])


def test_evaluate_reads_recorded_rows(tmp_path, capsys):
    """`evaluate --rows` evaluates a window of a `RecordedRows` file (here made of
    synthetic rows) exactly as `evaluate_verifier` does on the same rows, and names a
    window outside the file in one line."""
    import numpy as np

    import eqx_specdec as es
    from eqx_specdec.llm import RecordedRows

    q, p, _ = es.evaluation.synthetic_distributions("peaked", 2, 6, 0)
    q2, p2, _ = es.evaluation.synthetic_distributions("flat", 2, 6, 1)
    rows = RecordedRows(
        np.stack([q, q2]).astype(np.float32),
        np.stack([p, p2]).astype(np.float32),
        np.zeros((2, 2), np.int32),
    )
    rows.save(tmp_path / "rows.npz")
    loaded = RecordedRows.load(tmp_path / "rows.npz")
    out = json.loads(
        _run(["evaluate", "--rows", str(tmp_path / "rows.npz"), "--window", "1",
              "--json"], capsys)
    )  # fmt: skip
    direct = es.evaluation.evaluate_verifier(
        es.Verifier(),
        np.asarray(loaded.draft_probs[1], np.float64),
        np.asarray(loaded.target_probs[1], np.float64),
    )
    assert out["method"] == "quadrature" and out["vocab"] == 6 and out["gamma"] == 2
    assert out["tokens_per_step"] == pytest.approx(direct.tokens_per_step, abs=1e-9)
    assert out["distance"] < 1e-6
    with pytest.raises(SystemExit):
        _cli.main(["evaluate", "--rows", str(tmp_path / "rows.npz"), "--window", "2"])
    assert "--window must lie in [0, 2)" in capsys.readouterr().err
