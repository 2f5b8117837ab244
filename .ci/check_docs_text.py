"""Fails if the built site shows a reader something it should not.

- A private path (`equinox._module._module.Module`, `jaxlib._jax.Array`,
  `eqx_specdec._verify.verifier.Verifier`) or inherited boilerplate ("Initialize self.
  See help(type(self))...", dataclass internals) on a page: readers write public names.
- A literal backslash in a table cell (an escaped `|` that Markdown did not unescape).
- A reference to a file outside the project (the notes it was started from).

    python .ci/check_docs_text.py site
"""

import html
import pathlib
import re
import sys


site = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "site")
pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
PRIVATE = re.compile(r"\b(?:equinox|jaxlib|jax|eqx_specdec)(?:\.\w+)*\._[a-z]\w*")
BOILERPLATE = ("Initialize self.", "__dataclass_fields__", "help(type(self))")
OUTSIDE = re.compile(r"\b(?:VARIANTS|SPEC|STYLE)\.md\b|\.\./shared\b")
CELL = re.compile(r"<td[^>]*>(.*?)</td>", re.S)
TAG = re.compile(r"<[^>]+>")
# Code blocks hold code, where a private attribute (`module._field`) may be correct.
CODE = re.compile(r"<pre.*?</pre>", re.S)

problems = []
for page in pages:
    source = page.read_text()
    text = html.unescape(TAG.sub("", CODE.sub("", source)))
    name = page.relative_to(site)
    problems += [
        f"{name}: private path {m}" for m in sorted(set(PRIVATE.findall(text)))
    ]
    problems += [f"{name}: boilerplate {b!r}" for b in BOILERPLATE if b in text]
    problems += [f"{name}: refers to {m}" for m in sorted(set(OUTSIDE.findall(text)))]
    for cell in CELL.findall(source):
        if "\\" in html.unescape(TAG.sub("", cell)) and "arithmatex" not in cell:
            problems.append(
                f"{name}: a literal backslash in the table cell {cell[:60]!r}"
            )
if problems:
    print("The docs show what a reader should not see:", *problems, sep="\n  ")
    sys.exit(1)
print(
    f"docs text check: {len(pages)} pages, no private paths, no boilerplate, no literal "
    "backslashes in tables, no references outside the project"
)
