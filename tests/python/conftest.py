from __future__ import annotations

import pytest

import ringtree


@pytest.fixture(autouse=True)
def _no_leftover_group():
    """Every test starts and ends without a default group in this process."""
    yield
    if ringtree.is_initialized():
        ringtree.destroy_process_group()


@pytest.fixture
def world1():
    """A default group of one rank in this process, over a HashStore."""
    ringtree.init_process_group("gloo", store=ringtree.HashStore(), rank=0, world_size=1)
    yield ringtree.group.WORLD
    if ringtree.is_initialized():
        ringtree.destroy_process_group()
