"""Sources: parallel files, Multi30K (local, real, downloaded), TFDS, dispatch."""

from __future__ import annotations

import gzip
import http.server
import threading
from pathlib import Path

import pytest

from attnmt.data import sources
from attnmt.data.sources import load_pairs, multi30k_pairs, read_parallel_files, tfds_pairs
from attnmt.errors import DataError
from tests.helpers import shared_data_dir

SRC_LINES = ["Ein Hund.", "  two  spaces inside  ", "", "line\u2028with a separator", "x"]
TGT_LINES = ["A dog.", "b", "", "c", "y"]


def write(path: Path, lines: list[str], newline: str = "\n", final: bool = True) -> Path:
    data = newline.join(lines) + (newline if final else "")
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data.encode("utf-8")))
    else:
        path.write_bytes(data.encode("utf-8"))
    return path


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("final", [True, False])
def test_read_parallel_files(tmp_path: Path, suffix: str, newline: str, final: bool) -> None:
    src = write(tmp_path / f"a.de{suffix}", SRC_LINES, newline, final)
    tgt = write(tmp_path / f"a.en{suffix}", TGT_LINES, newline, final)
    # Expected value built by hand: the lines exactly as written, empty line kept.
    assert read_parallel_files(src, tgt) == list(zip(SRC_LINES, TGT_LINES, strict=True))


def test_missing_file_names_path(tmp_path: Path) -> None:
    tgt = write(tmp_path / "ok.en", ["a"])
    with pytest.raises(DataError, match=r"nope\.de"):
        read_parallel_files(tmp_path / "nope.de", tgt)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_bad_utf8_names_file_and_line(tmp_path: Path, suffix: str) -> None:
    data = b"fine\nalso fine\nbad \xff byte\nfine\n"
    src = tmp_path / f"broken.de{suffix}"
    src.write_bytes(gzip.compress(data) if suffix else data)
    tgt = write(tmp_path / "ok.en", ["a", "b", "c", "d"])
    with pytest.raises(DataError) as info:
        read_parallel_files(src, tgt)
    assert "broken.de" in str(info.value)
    assert "line 3" in str(info.value)


def test_line_count_mismatch_names_both(tmp_path: Path) -> None:
    src = write(tmp_path / "x.de", ["a", "b", "c"])
    tgt = write(tmp_path / "y.en", ["a", "b"])
    with pytest.raises(DataError) as info:
        read_parallel_files(src, tgt)
    message = str(info.value)
    assert "x.de" in message and "y.en" in message
    assert "3" in message and "2" in message


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_empty_file_named(tmp_path: Path, suffix: str) -> None:
    src = tmp_path / f"empty.de{suffix}"
    src.write_bytes(gzip.compress(b"") if suffix else b"")
    tgt = write(tmp_path / "ok.en", ["a"])
    with pytest.raises(DataError, match=r"empty\.de"):
        read_parallel_files(src, tgt)


def test_corrupt_gzip_named(tmp_path: Path) -> None:
    src = tmp_path / "junk.de.gz"
    src.write_bytes(b"this is not gzip")
    tgt = write(tmp_path / "ok.en", ["a"])
    with pytest.raises(DataError, match=r"junk\.de\.gz"):
        read_parallel_files(src, tgt)


# ---------------------------------------------------------------------------- Multi30K


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sources.MULTI30K_ENV, raising=False)


def write_multi30k(directory: Path, split: str, n: int, gz: bool = False) -> dict[str, list[str]]:
    directory.mkdir(parents=True, exist_ok=True)
    texts = {lang: [f"{split} {lang} sentence {i}" for i in range(n)] for lang in ("en", "de")}
    for lang, lines in texts.items():
        write(directory / f"{split}.{lang}{'.gz' if gz else ''}", lines)
    return texts


@pytest.mark.parametrize("gz", [False, True])
def test_multi30k_from_data_dir(tmp_path: Path, no_env: None, gz: bool) -> None:
    texts = write_multi30k(tmp_path, "test_2016_flickr", 3, gz)
    expected = list(zip(texts["de"], texts["en"], strict=True))
    assert multi30k_pairs("test_2016_flickr", "de", "en", data_dir=str(tmp_path)) == expected
    # "test" is an alias; a parent folder holding multi30k/ also works.
    assert multi30k_pairs("test", "de", "en", data_dir=str(tmp_path)) == expected
    nested = tmp_path / "root"
    write_multi30k(nested / "multi30k", "val", 2)
    assert len(multi30k_pairs("validation", "en", "de", data_dir=str(nested))) == 2


def test_multi30k_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = write_multi30k(tmp_path, "val", 4)
    monkeypatch.setenv(sources.MULTI30K_ENV, str(tmp_path))
    pairs = multi30k_pairs("val", "en", "de", data_dir=str(tmp_path / "empty"))
    assert pairs == list(zip(texts["en"], texts["de"], strict=True))


def test_multi30k_folder_recorded_for_later_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run trained with only the environment variable set records the absolute folder,
    # so that `attnmt evaluate` later, without it and from elsewhere, reads the same files.
    texts = write_multi30k(tmp_path / "m30k", "val", 3)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(sources.MULTI30K_ENV, "m30k")
    recorded = sources.multi30k_recorded_dir("")
    assert recorded == str((tmp_path / "m30k").resolve())
    monkeypatch.delenv(sources.MULTI30K_ENV)
    monkeypatch.chdir("/")
    pairs = multi30k_pairs("val", "en", "de", data_dir=recorded)
    assert pairs == list(zip(texts["en"], texts["de"], strict=True))
    assert sources.multi30k_recorded_dir("given/dir") == "given/dir"  # explicit wins
    assert sources.multi30k_recorded_dir("") == ""  # nothing to record: download


@pytest.mark.parametrize(("split", "src", "tgt"), [("dev2", "en", "de"), ("val", "en", "xx")])
def test_multi30k_bad_names(split: str, src: str, tgt: str) -> None:
    with pytest.raises(DataError, match="multi30k"):
        multi30k_pairs(split, src, tgt)


@pytest.mark.parametrize(
    ("split", "count"), [("train", 29_000), ("val", 1_014), ("test_2016_flickr", 1_000)]
)
def test_multi30k_real_counts(split: str, count: int, no_env: None) -> None:
    directory = shared_data_dir() / "multi30k"
    if not (directory / f"{split}.en").is_file():
        pytest.skip(f"real Multi30K not found in {directory} (set ATTNMT_DATA_DIR)")
    pairs = multi30k_pairs(split, "en", "de", data_dir=str(directory))
    assert len(pairs) == count
    assert all(isinstance(s, str) and isinstance(t, str) for s, t in pairs[:10])


class _Server:
    """A throwaway HTTP server on 127.0.0.1 serving one folder, counting requests."""

    def __init__(self, root: Path) -> None:
        self.paths: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs) -> None:
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self) -> None:
                server.paths.append(self.path)
                super().do_GET()

            def log_message(self, *args) -> None:  # keep test output clean
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/raw"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def test_multi30k_download_cache_reuse(tmp_path: Path, no_env: None) -> None:
    texts = write_multi30k(tmp_path / "www" / "raw", "train", 5, gz=True)
    cache = tmp_path / "cache"
    server = _Server(tmp_path / "www")
    try:
        pairs = multi30k_pairs("train", "en", "de", download_url=server.url, cache_dir=str(cache))
    finally:
        server.stop()
    assert pairs == list(zip(texts["en"], texts["de"], strict=True))
    assert sorted(server.paths) == ["/raw/train.de.gz", "/raw/train.en.gz"]
    assert sorted(p.name for p in cache.iterdir()) == ["train.de.gz", "train.en.gz"]
    # The server is gone: the second call must be served from the cache alone.
    again = multi30k_pairs("train", "en", "de", download_url=server.url, cache_dir=str(cache))
    assert again == pairs
    assert len(server.paths) == 2


def test_multi30k_download_404(tmp_path: Path, no_env: None) -> None:
    (tmp_path / "www" / "raw").mkdir(parents=True)
    cache = tmp_path / "cache"
    server = _Server(tmp_path / "www")
    try:
        with pytest.raises(DataError) as info:
            multi30k_pairs("val", "en", "fr", download_url=server.url, cache_dir=str(cache))
    finally:
        server.stop()
    message = str(info.value)
    assert f"{server.url}/val.en.gz" in message
    assert "data_dir" in message and sources.MULTI30K_ENV in message
    assert list(cache.iterdir()) == []  # no partial file left behind


def test_multi30k_download_not_gzip(tmp_path: Path, no_env: None) -> None:
    (tmp_path / "www" / "raw").mkdir(parents=True)
    (tmp_path / "www" / "raw" / "val.en.gz").write_text("<html>login page</html>")
    server = _Server(tmp_path / "www")
    try:
        with pytest.raises(DataError, match="gzip"):
            multi30k_pairs("val", "en", "de", download_url=server.url, cache_dir=str(tmp_path))
    finally:
        server.stop()
    assert not (tmp_path / "val.en.gz").exists()


# ---------------------------------------------------------------------------- TFDS


@pytest.fixture(scope="module")
def tfds():
    return pytest.importorskip("tensorflow_datasets")


def test_tfds_pairs_mock(tfds, tmp_path: Path) -> None:
    # mock_data generates random examples from the builder's feature spec without
    # touching the network or any prepared files, so tfds.load works offline here.
    with tfds.testing.mock_data(num_examples=6):
        pairs = list(tfds_pairs("wmt14_translate/de-en", "train", "en", "de", str(tmp_path)))
        reverse = list(tfds_pairs("wmt14_translate/de-en", "val", "de", "en", str(tmp_path)))
        # Reference: the raw feature dicts, read with TFDS directly.
        ds = tfds.load("wmt14_translate/de-en", split="train", data_dir=str(tmp_path))
        raw = [(ex["en"].decode(), ex["de"].decode()) for ex in tfds.as_numpy(ds)]
    assert len(pairs) == 6
    assert all(isinstance(s, str) and isinstance(t, str) for s, t in pairs + reverse)
    assert pairs == raw
    assert len(reverse) == 6


def test_tfds_unknown_language(tfds, tmp_path: Path) -> None:
    with tfds.testing.mock_data(num_examples=2), pytest.raises(DataError, match="'fr'"):
        tfds_pairs("wmt14_translate/de-en", "train", "en", "fr", str(tmp_path))


@pytest.mark.parametrize("name", ["wmt14_translate/de-en", "no_such_dataset/xx"])
def test_tfds_missing_is_data_error(tfds, tmp_path: Path, name: str) -> None:
    with pytest.raises(DataError) as info:
        tfds_pairs(name, "train", "en", "de", str(tmp_path))
    assert name in str(info.value)
    assert "Available datasets" not in str(info.value)  # no dump of the TFDS catalogue


# ---------------------------------------------------------------------------- dispatch


def test_load_pairs_files_templates(tmp_path: Path) -> None:
    write(tmp_path / "train.de", ["ein", "zwei"])
    write(tmp_path / "train.en", ["one", "two"])
    template = str(tmp_path / "{split}.{lang}")
    got = load_pairs("files", "train", "de", "en", src_path=template, tgt_path=template)
    assert got == [("ein", "one"), ("zwei", "two")]
    explicit = load_pairs(
        "files",
        "train",
        "en",
        "de",
        src_path=str(tmp_path / "{split}.{src}"),
        tgt_path=str(tmp_path / "{split}.{tgt}"),
    )
    assert explicit == [("one", "ein"), ("two", "zwei")]


def test_load_pairs_multi30k(tmp_path: Path, no_env: None) -> None:
    texts = write_multi30k(tmp_path, "val", 2)
    got = load_pairs("multi30k", "val", "en", "de", data_dir=str(tmp_path))
    assert got == list(zip(texts["en"], texts["de"], strict=True))


def test_load_pairs_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load_pairs("csv", "train", "en", "de")
    assert all(kind in str(info.value) for kind in ("multi30k", "tfds", "files"))
    with pytest.raises(DataError, match="bogus"):
        load_pairs("files", "train", "en", "de", src_path="a", tgt_path="b", bogus=1)
    with pytest.raises(DataError, match="tgt_path"):
        load_pairs("files", "train", "en", "de", src_path="a")
    with pytest.raises(DataError, match="placeholder"):
        load_pairs("files", "train", "en", "de", src_path="{splt}", tgt_path="b")
    with pytest.raises(DataError, match="name"):
        load_pairs("tfds", "train", "en", "de")
