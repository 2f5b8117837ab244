"""One speed story: the numbers the README and the docs show come from the tables that
`python benchmarks/run_all.py` writes, and from nowhere else."""

import pathlib
import re

from benchmarks import story


ROOT = pathlib.Path(__file__).parent.parent
RESULTS = ROOT / "benchmarks" / "results-cpu.md"
INCLUDE = re.compile(r'--8<-- "benchmarks/results-cpu\.md:(\w+)"')
# A measured quantity: a number with a unit of time, size, speed or a ratio.
MEASURED = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:x|%|µs|ms|s|GB/s|MB|kB)(?!\w)"
)


def test_the_readme_claim_is_the_one_computed_from_the_tables():
    results = RESULTS.read_text()
    readme = (ROOT / "README.md").read_text()
    assert story.readme_claim(readme) == story.claim(results)
    assert re.search(r"^- machine: a \d+-core", results, re.M)
    assert re.search(r"^- date: \d{4}-\d\d-\d\d$", results, re.M)


def test_every_included_section_is_in_the_results():
    results = RESULTS.read_text()
    included = set()
    for page in (ROOT / "docs").glob("*.md"):
        included |= set(INCLUDE.findall(page.read_text()))
    assert {"claim", "machine", "bench", "warps", "trees", "demo"} <= included
    for name in included:
        assert f"<!-- --8<-- [start:{name}] -->" in results, name
        assert f"<!-- --8<-- [end:{name}] -->" in results, name


def test_pages_with_tables_quote_no_number_the_tables_do_not_show():
    # Whole quantities, not substrings: "5x" is not shown by a table cell "55.1x".
    shown = set(MEASURED.findall(RESULTS.read_text()))
    pages = [p for p in (ROOT / "docs").glob("*.md") if INCLUDE.search(p.read_text())]
    assert {"performance.md", "serving.md", "scaling_out.md"} <= {p.name for p in pages}
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # commands
        quoted = MEASURED.findall(text)
        missing = [number for number in quoted if number not in shown]
        assert not missing, f"numbers in {page.name} not in the tables: {missing}"


def test_the_claim_follows_the_tables():
    # A results file of two serving rows and one small one: the claim spans the serving
    # rows' ratios only.
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
        ]
    )
    sentence = story.claim(results)
    assert sentence.startswith("On a 2-core CPU (Test),")
    assert "32x to 44x faster than a vLLM-style PyTorch" in sentence
    assert "12x to 20x faster than a naive JAX" in sentence
    assert "0.7x to 1.2x as fast as PyTorch warping" in sentence
