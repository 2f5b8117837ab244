"""Fails if what the README and the docs claim does not follow from the repository:

- one speed story: the numbers the docs quote come from the tables that
  `python benchmarks/run_all.py` writes (`benchmarks/results-BACKEND.md`: the CPU's,
  and an accelerator's where one ran), and nowhere else; the claim is the one
  `benchmarks/story.py` computes from the CPU's (its rule is checked on a made-up table
  first); the README quotes no measurement (it links to the docs);
- every `--8<--` include of a page names a file that exists, and each `file:section`
  include a section that the file marks;
- CI (`.ci/run`) runs exactly the test command the README gives.

    python .ci/check_docs_claims.py
"""

import pathlib
import re
import sys


ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import story  # noqa: E402


RESULTS = ROOT / "benchmarks" / "results-cpu.md"
INCLUDE = re.compile(r'--8<-- "benchmarks/(results-\w+\.md):(\w+)"')
# A measured quantity: a number with a unit of time, size, speed or a ratio.
MEASURED = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:x|%|µs|ms|s|GB/s|MB|kB)(?!\w)"
)


def the_claim_rule():
    """The claim spans the serving rows' ratios only (a made-up results file)."""
    results = "\n".join(
        [
            "- machine: a 2-core CPU (Test)",
            "| B, G, V | naive JAX | PyTorch, unchecked | PyTorch, default |",
            "|---|---|---|---|",
            "| 4, 4, 6 | 0.5x | 1.0x | 999.0x |",
            "| 64, 5, 128256 | 20.4x | 30.0x | 31.6x |",
            "| 256, 8, 32000 | 12.0x | 40.0x | 44.4x |",
            "",
            "| B, G, V | PyTorch temperature (ms) / ours | PyTorch top-k 50 (ms) / ours |",
            "|---|---|---|",
            "| 16, 5, 32000 | 9 / 0.66x | 26 / 0.9x |",
            "| 64, 5, 128256 | 218 / 1.24x | 489 / 0.9x |",
            "",
            "| B, G, V | JAX temperature 0.7 (ms) / ours | JAX top-k 50 (ms) / ours "
            "| JAX top-p 0.9 (ms) / ours | JAX min-p 0.05 (ms) / ours |",
            "|---|---|---|---|---|",
            "| 16, 5, 32000 | 3 / 1.63x | 4 / 1.1x | 9 / 3.0x | 3 / 1.2x |",
            "| 64, 5, 128256 | 9 / 2.46x | 12 / 0.9x | 30 / 4.1x | 9 / 2.0x |",
        ]
    )
    sentence = story.claim(results)
    assert sentence.startswith("On a 2-core CPU (Test),"), sentence
    assert "32x to 44x faster than a vLLM-style PyTorch" in sentence, sentence
    assert "12x to 20x faster than a naive JAX" in sentence, sentence
    assert "0.7x to 1.2x as fast as PyTorch warping" in sentence, sentence
    assert "1.6x to 2.5x as fast as `jax.nn.softmax`" in sentence, sentence
    assert "min-p 0.05 as well, 0.9x to 4.1x as fast as the same" in sentence, sentence


def the_readme_quotes_no_measurement():
    # Measured numbers belong in the docs, next to the tables they come from; a bound
    # the README promises ("under 30 s") is not a measurement.
    readme = re.sub(r"```.*?```", "", (ROOT / "README.md").read_text(), flags=re.S)
    readme = re.sub(r"under \d+ s\b", "", readme)
    assert not MEASURED.findall(readme), MEASURED.findall(readme)
    results = RESULTS.read_text()
    assert re.search(r"^- machine: a \d+-core", results, re.M), "results: machine"
    assert re.search(r"^- date: \d{4}-\d\d-\d\d$", results, re.M), "results: date"


def the_included_sections():
    included = set()
    for page in (ROOT / "docs").glob("*.md"):
        included |= set(INCLUDE.findall(page.read_text()))
    on_cpu = {name for file, name in included if file == RESULTS.name}
    assert {"claim", "machine", "bench", "warps", "trees", "demo"} <= on_cpu, included
    for file, name in included:
        results = (RESULTS.parent / file).read_text()
        assert f"<!-- --8<-- [start:{name}] -->" in results, (file, name)
        assert f"<!-- --8<-- [end:{name}] -->" in results, (file, name)


def the_quoted_numbers():
    # Whole quantities, not substrings: "5x" is not shown by a table cell "55.1x".
    shown = set()
    for results in RESULTS.parent.glob("results-*.md"):
        shown |= set(MEASURED.findall(results.read_text()))
    pages = [p for p in (ROOT / "docs").glob("*.md") if INCLUDE.search(p.read_text())]
    names = {p.name for p in pages}
    assert {"performance.md", "serving.md", "scaling_out.md"} <= names, names
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # commands
        missing = [n for n in MEASURED.findall(text) if n not in shown]
        assert not missing, f"numbers in {page.name} not in the tables: {missing}"


def the_snippet_includes():
    for page in (ROOT / "docs").rglob("*.md"):
        text = page.read_text()
        assert "--8 <" not in text, page
        for target in re.findall(r'^ *--8<-- "(.*)"$', text, re.M):
            path, _, section = target.partition(":")
            assert (ROOT / path).is_file(), (page.name, target)
            if section:
                marked = (ROOT / path).read_text()
                for end in ("start", "end"):
                    assert f"--8<-- [{end}:{section}]" in marked, (page.name, target)


def the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    commands = [b for b in blocks if "pytest" in b]
    assert len(commands) == 1, commands
    assert commands[0] in (ROOT / ".ci" / "run").read_text().splitlines(), commands[0]


CHECKS = [
    the_claim_rule,
    the_readme_quotes_no_measurement,
    the_included_sections,
    the_quoted_numbers,
    the_snippet_includes,
    the_readme_test_command,
]


def main():
    failed = []
    for check in CHECKS:
        try:
            check()
        except AssertionError as error:
            failed.append(f"{check.__name__.replace('_', ' ')}: {error}")
    if failed:
        print("Docs claims that do not hold:", *failed, sep="\n  ")
        sys.exit(1)
    print(f"docs claims: {len(CHECKS)} checks hold")


if __name__ == "__main__":
    main()
