"""Where sentence pairs come from: parallel text files, Multi30K, TFDS datasets.

Every source returns (or yields) ``(source_sentence, target_sentence)`` string pairs.
User-caused problems (missing files, bad encodings, unknown datasets) raise ``DataError``
with a message naming the file and line or the dataset, so the CLI can print it alone.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import itertools
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from etils import epath

from attnmt.errors import DataError
from attnmt.storage import as_path, is_remote

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
MULTI30K_ENV = "ATTNMT_MULTI30K_DIR"
MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")
MULTI30K_LANGS = ("en", "de", "fr", "cs")
_SPLIT_ALIASES = {"test": "test_2016_flickr", "validation": "val", "valid": "val", "dev": "val"}
# TFDS names its held-out splits differently from Multi30K; accept our names too.
_TFDS_SPLIT_ALIASES = {"val": "validation", "valid": "validation", "dev": "validation"}
_DOWNLOAD_TIMEOUT_S = 60.0

Pair = tuple[str, str]


def _decoded(path: epath.Path, number: int, line: bytes) -> str:
    """Line `number` of `path` as strict UTF-8, without its terminator."""
    # Lines end at b"\n" only: str.splitlines() would also split on U+2028, \x1c, ...
    # which occur inside real sentences and would misalign the two sides.
    line = line.removesuffix(b"\n").removesuffix(b"\r")
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}:{number}: invalid UTF-8 (byte {line[e.start]:#04x} at line {number}); "
            "convert the file to UTF-8"
        ) from None


def _lines(path: epath.Path) -> Iterator[str]:
    """The lines of one file (plain or .gz), read as they are needed; checked to exist
    now, and to be non-empty once read."""
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file")
    return _read_lines(path)


def _read_lines(path: epath.Path) -> Iterator[str]:
    number = 0
    try:
        with contextlib.ExitStack() as stack:
            file: IO[bytes] = stack.enter_context(path.open("rb"))
            if path.suffix == ".gz":
                file = stack.enter_context(gzip.GzipFile(fileobj=file))
            for number, line in enumerate(file, 1):
                yield _decoded(path, number, line)
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read file: {e}") from e
    if number == 0:
        raise DataError(f"{path}: file is empty")


def stream_parallel_files(
    src_path: str | os.PathLike, tgt_path: str | os.PathLike
) -> Iterator[Pair]:
    """Yields (src, tgt) pairs of two line-aligned files (plain or ``.gz``, local or in a
    bucket), one line of each at a time: a corpus of any size is never held whole.

    Empty lines are kept; filtering happens when tokenizing. Files of different lengths
    raise DataError (with both line counts) when the shorter one ends.
    """
    src_path, tgt_path = as_path(src_path, "data file"), as_path(tgt_path, "data file")
    return _zip_lines(_lines(src_path), _lines(tgt_path), src_path, tgt_path)


def _zip_lines(
    src: Iterator[str], tgt: Iterator[str], src_path: epath.Path, tgt_path: epath.Path
) -> Iterator[Pair]:
    end = object()  # fills in for the shorter file's missing lines
    for count, (a, b) in enumerate(itertools.zip_longest(src, tgt, fillvalue=end)):
        if a is end or b is end:
            src_count = count + (a is not end) + sum(1 for _ in src)
            tgt_count = count + (b is not end) + sum(1 for _ in tgt)
            raise DataError(
                f"parallel files differ in line count: {src_path} has {src_count} lines, "
                f"{tgt_path} has {tgt_count} lines"
            )
        yield a, b


def read_parallel_files(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> list[Pair]:
    """Reads two line-aligned files (plain or ``.gz``, local or in a bucket) into (src, tgt)
    pairs.

    Empty lines are kept; filtering happens when tokenizing.
    """
    return list(stream_parallel_files(src_path, tgt_path))


# ---------------------------------------------------------------------------- Multi30K


def _multi30k_split(split: str) -> str:
    split = _SPLIT_ALIASES.get(split, split)
    if split not in MULTI30K_SPLITS:
        raise DataError(
            f"multi30k: unknown split {split!r}; valid splits are {', '.join(MULTI30K_SPLITS)} "
            f"(aliases: {', '.join(sorted(_SPLIT_ALIASES))})"
        )
    return split


def _find_local(directory: epath.Path, split: str, lang: str) -> epath.Path | None:
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def _find_pair(
    directory: epath.Path, split: str, langs: tuple[str, str]
) -> tuple[epath.Path, epath.Path] | None:
    # Also look in a "multi30k" subfolder so a general data root (e.g. shared/data) works.
    for d in (directory, directory / "multi30k"):
        found = [_find_local(d, split, lang) for lang in langs]
        if found[0] is not None and found[1] is not None:
            return found[0], found[1]
    return None


def _download(url: str, dest: Path) -> None:
    """Downloads ``url`` to ``dest`` atomically (temp file in the same folder, then rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        with (
            os.fdopen(fd, "wb") as out,
            urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response,
        ):
            while chunk := response.read(1 << 20):
                out.write(chunk)
        with open(tmp, "rb") as f:
            magic = f.read(2)
        # A proxy or captive portal can answer 200 with an HTML page; never cache that.
        if dest.suffix == ".gz" and magic != b"\x1f\x8b":
            raise ValueError("the response is not a gzip file")
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def multi30k_recorded_dir(data_dir: str) -> str:
    """The folder to record in a run's config: ``data_dir``, else ``$ATTNMT_MULTI30K_DIR``
    made absolute, so that evaluating the run later finds the same files without the
    variable (and from another working directory); "" when neither is set (download)."""
    env_dir = os.environ.get(MULTI30K_ENV)
    if data_dir or not env_dir:
        return data_dir
    return env_dir if is_remote(env_dir) else str(Path(env_dir).expanduser().resolve())


def multi30k_pairs(
    split: str,
    src_lang: str,
    tgt_lang: str,
    data_dir: str | None = None,
    download_url: str | None = None,
    cache_dir: str | None = None,
) -> list[Pair]:
    """Multi30K (task 1) pairs for ``split`` from a local folder, or downloaded and cached.

    Looks in ``data_dir``, then ``$ATTNMT_MULTI30K_DIR``, then downloads
    ``{split}.{lang}.gz`` from ``download_url`` into ``cache_dir``.
    """
    split = _multi30k_split(split)
    for lang in (src_lang, tgt_lang):
        if lang not in MULTI30K_LANGS:
            raise DataError(
                f"multi30k: unknown language {lang!r}; valid languages are "
                f"{', '.join(MULTI30K_LANGS)}"
            )
    if src_lang == tgt_lang:
        raise DataError(f"multi30k: source and target language are both {src_lang!r}")
    langs = (src_lang, tgt_lang)

    searched = []
    env_dir = os.environ.get(MULTI30K_ENV)
    for directory, label in ((data_dir, "data_dir"), (env_dir, MULTI30K_ENV)):
        if directory:
            found = _find_pair(as_path(directory, label).expanduser(), split, langs)
            if found is not None:
                return read_parallel_files(*found)
            searched.append(f"{label}={directory}")

    base_url = (download_url or MULTI30K_URL).rstrip("/")
    cache = Path(cache_dir or Path.home() / ".cache" / "attnmt" / "multi30k").expanduser()
    paths = []
    for lang in langs:
        dest = cache / f"{split}.{lang}.gz"
        if not dest.is_file():
            url = f"{base_url}/{split}.{lang}.gz"
            try:
                _download(url, dest)
            except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
                where = f" (not found in {', '.join(searched)})" if searched else ""
                raise DataError(
                    f"multi30k: cannot download {url}: {e}. Supply a local copy of "
                    f"{split}.{src_lang} and {split}.{tgt_lang} (plain or .gz) with data_dir "
                    f"or the {MULTI30K_ENV} environment variable{where}"
                ) from e
        paths.append(dest)
    return read_parallel_files(*paths)


# ---------------------------------------------------------------------------- TFDS


def _import_tfds() -> Any:
    # Only matters if TF is not imported yet: keep its C++ logging quiet.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise DataError(
            f"TFDS sources need tensorflow-datasets and tensorflow-cpu ({e}); "
            "install them with: pip install 'attnmt[tfds]'"
        ) from e
    # TF would otherwise reserve accelerator memory that JAX needs; it only reads records.
    with contextlib.suppress(RuntimeError, ValueError):  # devices already initialised
        tf.config.set_visible_devices([], "GPU")
    return tfds


def tfds_pairs(
    name: str,
    split: str,
    src_lang: str,
    tgt_lang: str,
    data_dir: str | None = None,
    download: bool = False,
) -> Iterator[Pair]:
    """Yields (src, tgt) strings from a prepared TFDS translation dataset.

    ``name`` is e.g. ``wmt14_translate/de-en``; features are keyed by language code.
    The dataset is opened eagerly so a missing dataset fails here, not at first ``next``.
    """
    tfds = _import_tfds()
    split = _TFDS_SPLIT_ALIASES.get(split, split)
    try:
        ds = tfds.load(name, split=split, data_dir=data_dir, download=download)
    except Exception as e:  # any TFDS/TF failure here means the data is not usable
        first_line = str(e).strip().split("\n", 1)[0]
        where = f" in {data_dir}" if data_dir else ""
        raise DataError(
            f"tfds dataset {name!r} (split {split!r}) is not available{where}: {first_line} "
            "Prepare it first (tfds build, or download=True) or check the name."
        ) from None
    features = sorted(ds.element_spec) if isinstance(ds.element_spec, dict) else []
    missing = [lang for lang in (src_lang, tgt_lang) if lang not in features]
    if missing:
        raise DataError(
            f"tfds dataset {name!r} has no language {', '.join(map(repr, missing))}; "
            f"its features are {', '.join(features) or 'not a dict'}"
        )
    return _iterate_tfds(tfds, ds, name, src_lang, tgt_lang)


def _iterate_tfds(tfds: Any, ds: Any, name: str, src_lang: str, tgt_lang: str) -> Iterator[Pair]:
    import tensorflow as tf

    try:
        for example in tfds.as_numpy(ds):
            yield example[src_lang].decode("utf-8"), example[tgt_lang].decode("utf-8")
    except tf.errors.OpError as e:
        raise DataError(f"tfds dataset {name!r}: cannot read records: {e.message}") from None


# ---------------------------------------------------------------------------- dispatch

_KIND_OPTIONS = {
    "multi30k": ("data_dir", "download_url", "cache_dir"),
    "tfds": ("name", "data_dir", "download"),
    "files": ("src_path", "tgt_path"),
    "treebank": ("data_dir", "splits", "pos", "leaves"),
}


def _fill_template(template: str, split: str, src: str, tgt: str, lang: str) -> str:
    try:
        return template.format(split=split, src=src, tgt=tgt, lang=lang)
    except (KeyError, IndexError, ValueError) as e:
        raise DataError(
            f"files: bad path template {template!r} ({e!r}); "
            "allowed placeholders are {split}, {src}, {tgt}, {lang}"
        ) from None


def load_pairs(kind: str, split: str, src_lang: str, tgt_lang: str, **options: Any) -> list[Pair]:
    """Loads all pairs of ``split`` from a source of ``kind`` (multi30k, tfds, files, or
    treebank: words → linearized trees, attnmt.data.parsing).

    For ``files``, ``src_path``/``tgt_path`` are templates with ``{split}``, ``{src}``,
    ``{tgt}`` and ``{lang}`` (this side's language), e.g. ``data/{split}.{lang}``.
    """
    return list(iter_pairs(kind, split, src_lang, tgt_lang, **options))


def iter_pairs(
    kind: str, split: str, src_lang: str, tgt_lang: str, **options: Any
) -> Iterator[Pair]:
    """The pairs of ``load_pairs``, streamed where the source allows it: ``files`` line by
    line and ``tfds`` record by record; ``multi30k`` and ``treebank`` (small corpora) are
    read whole first. Problems found on opening raise here, not at the first ``next``."""
    if kind not in _KIND_OPTIONS:
        raise DataError(
            f"unknown data source kind {kind!r}; valid kinds are {', '.join(_KIND_OPTIONS)}"
        )
    unknown = sorted(set(options) - set(_KIND_OPTIONS[kind]))
    if unknown:
        raise DataError(
            f"data source {kind!r}: unknown option(s) {', '.join(unknown)}; "
            f"valid options are {', '.join(_KIND_OPTIONS[kind])}"
        )
    if kind == "multi30k":
        return iter(multi30k_pairs(split, src_lang, tgt_lang, **options))
    if kind == "treebank":
        from attnmt.data.parsing import treebank_pairs

        return iter(treebank_pairs(split, **options))
    if kind == "tfds":
        if not options.get("name"):
            raise DataError("data source 'tfds' needs a dataset name, e.g. wmt14_translate/de-en")
        name = options.pop("name")
        return tfds_pairs(name, split, src_lang, tgt_lang, **options)
    for key in ("src_path", "tgt_path"):
        if not options.get(key):
            raise DataError(f"data source 'files' needs {key}, e.g. data/{{split}}.{{lang}}")
    src = _fill_template(options["src_path"], split, src_lang, tgt_lang, src_lang)
    tgt = _fill_template(options["tgt_path"], split, src_lang, tgt_lang, tgt_lang)
    return stream_parallel_files(src, tgt)
