"""The algorithm= keyword (a ringtree extension of the torch signatures): every
algorithm a collective implements can be chosen per call, a wrong one is refused before
any data moves."""

from __future__ import annotations

import ringtree
from harness import run_world


def test_algorithm_can_be_chosen_per_call():
    server = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = run_world("workers:algorithm_choice", 3, port=server.port, env={"RINGTREE_TRANSPORT": "shm"})
    for rank, result in enumerate(results):
        value = result["ok"]
        wrong = [case for case, exact in value["results"].items() if not exact]
        assert not wrong, f"rank {rank}: wrong results of " + ", ".join(wrong)
        assert len(value["errors"]) == 3, value["errors"]
        assert "chain" in value["errors"][0] and "nonsense" in value["errors"][1]
