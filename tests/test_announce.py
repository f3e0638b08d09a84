"""`relbench extrapolate` says what a long retrieval cell costs before it runs it (evaluators.announce_cost)."""

import dataclasses

import pytest

from relbench.evaluation.evaluators import ANNOUNCE_FROM, announce_cost


@dataclasses.dataclass
class FakeJob:
    announce: object


@pytest.mark.parametrize("multiple, expected_calls", [(ANNOUNCE_FROM - 1, 0), (ANNOUNCE_FROM, 1), (512, 1)])
def test_long_cells_time_one_trial_and_say_the_total(multiple, expected_calls):
    said, ran = [], []
    job = FakeJob(announce=said.append)
    announce_cost(job, "passkey", "bam          seed 0", {"train_length": 128}, 128 * multiple, 70,
                  lambda: ran.append(1))
    assert len(ran) == len(said) == expected_calls
    if said:
        assert f"passkey L={128 * multiple}" in said[0] and "70 trials" in said[0] and "for one trial" in said[0]


def test_nothing_is_timed_without_a_console():
    ran = []
    announce_cost(FakeJob(announce=None), "mqar", "x", {"train_length": 64}, 64 * 512, 560, lambda: ran.append(1))
    assert ran == []
