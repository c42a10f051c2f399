from __future__ import annotations

import pytest

import ringtree


@pytest.fixture(autouse=True)
def _no_leftover_group():
    """Every test starts and ends without a default group in this process."""
    yield
    if ringtree.is_initialized():
        ringtree.destroy_process_group()
