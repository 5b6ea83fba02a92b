"""The reversal corpus the in-process training tests learn (tests/helpers.py writes it)."""

import pytest

from tests.helpers import write_reversal_corpus


@pytest.fixture
def reversal_corpus(tmp_path):
    return write_reversal_corpus(tmp_path)
