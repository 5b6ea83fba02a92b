"""Where a run's files live: a local folder or a bucket (`gs://…`, any etils.epath URL).

Every path a run reads or writes (workdir, vocabulary, token cache, decodes, reports, data
files) goes through `as_path`, which returns an `epath.Path` for local and remote paths alike
and refuses what would go wrong: a URL scheme epath cannot serve, a missing filesystem
package, or a URL that lost a slash (`gs:/b/run`, what `pathlib.Path("gs://b/run")` makes),
which would otherwise become a local folder named `gs:` on a machine that may vanish.

epath serves `gs://` through TensorFlow's gfile when TensorFlow is importable and through
fsspec (gcsfs) otherwise. gfile's GCS client always talks to storage.googleapis.com, so a
run under gfile could not be tested against an emulator; attnmt selects fsspec (the
`EPATH_USE_TF` default below, before the first remote path is touched) so the code path that
is tested is the one that runs. Orbax reads the same setting for its folder operations;
its arrays go through TensorStore's own GCS driver.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from typing import IO

from attnmt.errors import ConfigError

# Set before etils first decides a remote backend (it caches the choice); an explicit
# EPATH_USE_TF in the environment still wins.
os.environ.setdefault("EPATH_USE_TF", "false")

from etils import epath

# URL scheme → the fsspec package epath needs for it, and the attnmt extra that installs it.
FILESYSTEMS = {
    "gs": ("gcsfs", "attnmt[gcs]"),
    "s3": ("s3fs", "s3fs"),
    "az": ("adlfs", "adlfs"),
    "hf": ("huggingface_hub", "huggingface_hub"),
}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
_BROKEN_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")  # one slash: not a drive letter

Path = epath.Path  # what every function here takes and returns


def is_remote(path: str | os.PathLike) -> bool:
    """True for a URL (`gs://…`), False for a local path."""
    return _URL.match(os.fspath(path)) is not None


def as_path(value: str | os.PathLike, what: str = "path") -> epath.Path:
    """`value` as an epath.Path; ConfigError (naming `what`) for a path that cannot work."""
    text = os.fspath(value)
    url = _URL.match(text)
    if url is None:
        broken = _BROKEN_URL.match(text)
        if broken and broken.group(1).lower() in FILESYSTEMS:
            raise ConfigError(
                f"{what} {text!r} looks like a URL that lost a slash; write "
                f"{broken.group(1)}://{text[len(broken.group(0)) :]}"
            )
        return epath.Path(text)
    scheme, rest = url.group(1).lower(), url.group(2)
    if scheme not in FILESYSTEMS:
        known = ", ".join(f"{name}://" for name in FILESYSTEMS)
        raise ConfigError(
            f"{what} {text!r}: unsupported URL scheme {scheme}://; use a local path or {known}"
        )
    if not rest.strip("/"):
        raise ConfigError(f"{what} {text!r} names no bucket")
    package, install = FILESYSTEMS[scheme]
    if importlib.util.find_spec(package) is None:
        raise ConfigError(f"{what} {text!r} needs the {package} package: pip install '{install}'")
    return epath.Path(text)


def local_only(value: str | os.PathLike, what: str) -> str:
    """`value` unchanged if it is a local path; ConfigError naming `what` for a URL."""
    text = os.fspath(value)
    if is_remote(text) or _BROKEN_URL.match(text):
        raise ConfigError(f"{what} must be a local path, got {text!r}")
    return text


def write_atomic(path: epath.Path, write: Callable[[IO[bytes]], None]) -> None:
    """Calls `write(file)` so that `path` appears whole or not at all.

    Locally: a temporary file in the same folder, renamed over `path`. Remotely an object
    appears only when its upload completes, so the bytes are staged in a local temporary
    file (kept off memory: a token cache can be large) and streamed up.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    remote = is_remote(path)
    folder = None if remote else os.fspath(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
        if remote:
            with open(tmp, "rb") as source, path.open("wb") as target:
                shutil.copyfileobj(source, target, 1 << 22)
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def write_bytes_atomic(path: epath.Path, data: bytes) -> None:
    write_atomic(path, lambda file: file.write(data))


def copy_file(source: epath.Path, target: epath.Path) -> None:
    """Copies one file between any two places (local or remote), overwriting `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with source.open("rb") as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 22)


def upload_tree(local: str | os.PathLike, target: epath.Path) -> list[epath.Path]:
    """Copies every file under the local folder `local` to the same place under `target`
    (overwriting); returns the files written."""
    written = []
    for root, _, names in os.walk(local):
        for name in names:
            source = os.path.join(root, name)
            destination = target / os.path.relpath(source, local)
            copy_file(epath.Path(source), destination)
            written.append(destination)
    return written
