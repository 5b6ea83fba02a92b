"""Strict mode (tests/strict_mode.py) fails a run for every way a test can prove nothing:
a skip at collection time (module level and in a conftest), a skip at run time (in the test,
in a fixture, by a mark), and an xfail, strict or not, passing or failing. Each case is a
real pytest run on files written here, with and without xdist (CI runs `-n 2`)."""

from __future__ import annotations

import textwrap

import pytest

from tests.helpers import REPO

pytest_plugins = ["pytester"]

PASSING = "def test_passes():\n    assert True\n"

CASES = {
    "module_importorskip": 'import pytest\npytest.importorskip("no_such_module_xyz")\n' + PASSING,
    "module_skip": 'import pytest\npytest.skip("no data", allow_module_level=True)\n',
    "runtime_skip": 'import pytest\ndef test_skips():\n    pytest.skip("no data")\n',
    "fixture_skip": textwrap.dedent(
        """
        import pytest
        @pytest.fixture
        def corpus():
            pytest.skip("no corpus")
        def test_uses(corpus):
            pass
        """
    ),
    "skipif_mark": "import pytest\n@pytest.mark.skipif(True, reason='x')\ndef test_s(): pass\n",
    "xfail_failing": "import pytest\n@pytest.mark.xfail\ndef test_x():\n    assert False\n",
    "xfail_passing": "import pytest\n@pytest.mark.xfail\ndef test_x():\n    assert True\n",
    "xfail_call": 'import pytest\ndef test_x():\n    pytest.xfail("known bug")\n',
}


@pytest.fixture(autouse=True)
def _no_plugin_autoload(monkeypatch):
    # The inner runs need none of the installed plugins (seconds to load each time); the
    # xdist runs name xdist explicitly.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def _write(pytester: pytest.Pytester, name: str, source: str) -> None:
    pytester.makeconftest('pytest_plugins = ["tests.strict_mode"]\n')
    pytester.makepyfile(**{f"test_{name}": PASSING if name == "ok" else source})
    pytester.makepyfile(test_fine=PASSING)


@pytest.mark.parametrize("name", sorted(CASES))
def test_strict_mode_fails_every_kind_of_skip(pytester, monkeypatch, name):
    _write(pytester, name, CASES[name])
    monkeypatch.setenv("ATTNMT_TESTS_STRICT", "1")
    strict = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert strict.ret != 0, strict.stdout.str()
    strict.stdout.fnmatch_lines(["*ATTNMT_TESTS_STRICT=1*"])
    assert strict.parseoutcomes().get("skipped", 0) == 0
    # Without strict mode the same files pass, with the skip or xfail counted as such.
    monkeypatch.setenv("ATTNMT_TESTS_STRICT", "0")
    relaxed = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert relaxed.ret == 0, relaxed.stdout.str()
    outcomes = relaxed.parseoutcomes()
    assert outcomes.get("skipped", 0) + outcomes.get("xfailed", 0) + outcomes.get("xpassed", 0)


def test_a_skip_in_a_conftest_fails_the_run(pytester, monkeypatch):
    pytester.makeconftest('pytest_plugins = ["tests.strict_mode"]\n')
    sub = pytester.mkpydir("extra")
    (sub / "conftest.py").write_text('import pytest\npytest.importorskip("no_such_module_xyz")\n')
    (sub / "test_extra.py").write_text(PASSING)
    pytester.makepyfile(test_fine=PASSING)
    monkeypatch.setenv("ATTNMT_TESTS_STRICT", "1")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret != 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*ATTNMT_TESTS_STRICT=1*"])


@pytest.mark.parametrize("name", ["module_importorskip", "runtime_skip", "xfail_failing"])
def test_strict_mode_fails_under_xdist(pytester, monkeypatch, name):
    _write(pytester, name, CASES[name])
    monkeypatch.setenv("ATTNMT_TESTS_STRICT", "1")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "-p", "no:cacheprovider")
    assert result.ret != 0, result.stdout.str()
    assert "ATTNMT_TESTS_STRICT=1" in result.stdout.str()


def test_a_clean_run_stays_green_under_strict_mode(pytester, monkeypatch):
    _write(pytester, "ok", PASSING)
    monkeypatch.setenv("ATTNMT_TESTS_STRICT", "1")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=2)
