"""ATTNMT_TESTS_STRICT=1 (set by .ci/run): every skip and every xfail fails the run.

A skip is how a test says "I proved nothing here". On a developer's machine that lacks the
shared corpora or an extra, that is honest; in CI, which has everything, it would let a run go
green on less than it claims. Skips arrive in three ways and all three are caught:

- at run time (`pytest.skip` in a test or fixture, a `skipif` mark): the test's report;
- at collection time (a module-level `pytest.importorskip`, or one in a conftest): the
  collector's report, which `pytest_runtest_makereport` never sees;
- expected failures (`xfail`, strict or not), which are skips by another name.

As a last line, the session's exit status is set to failure if the terminal's tally still
holds any skipped, xfailed or xpassed outcome (under xdist the controller sees every report).
Loaded by tests/conftest.py; tests/test_strict_mode.py runs pytest on files made to skip.
"""

from __future__ import annotations

import os

import pytest

_STRICT = pytest.StashKey[bool]()
NOT_ALLOWED = ("skipped", "xfailed", "xpassed")


def strict_requested() -> bool:
    return os.environ.get("ATTNMT_TESTS_STRICT", "") not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STRICT] = strict_requested()


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail(report: pytest.TestReport | pytest.CollectReport, what: str) -> None:
    reason = getattr(report, "wasxfail", "") or _reason(report)
    report.outcome = "failed"
    report.longrepr = f"{what} under ATTNMT_TESTS_STRICT=1 (CI runs every test): {reason}"
    if hasattr(report, "wasxfail"):
        del report.wasxfail


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not item.config.stash.get(_STRICT, False):
        return
    if hasattr(report, "wasxfail"):
        _fail(report, "xfail")
    elif report.skipped:
        _fail(report, "skipped")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    report = outcome.get_result()
    if collector.config.stash.get(_STRICT, False) and report.skipped:
        _fail(report, f"{collector.nodeid or collector.name} skipped at collection")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not session.config.stash.get(_STRICT, False):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(reporter, "stats", {})
    leftover = {key: len(stats[key]) for key in NOT_ALLOWED if stats.get(key)}
    if leftover and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter is not None:
            reporter.write_line(
                f"ATTNMT_TESTS_STRICT=1: {leftover} outcomes would have passed silently",
                red=True,
            )
