"""The compiled EVALB for the parse-scorer tests (see tests/evalb.py)."""

import pytest

from tests.evalb import Evalb, evalb_fixture


@pytest.fixture(scope="session")
def evalb(tmp_path_factory: pytest.TempPathFactory) -> Evalb:
    return evalb_fixture(tmp_path_factory)
