"""The demo's load schedule: tenants in phase (what `make demo` reports) or spread over their first period."""

from __future__ import annotations

import time
from collections import defaultdict
from itertools import pairwise

import pytest

from local.scenarios.load_client import LoadGenerator
from local.scenarios.noisy_neighbour import Scenario
from local.scenarios.observations import Observations


class _Recording(LoadGenerator):
    """The real schedule (``run``), with senders that record each scheduled send instead of posting it."""

    def __init__(self, scenario: Scenario) -> None:
        super().__init__("http://127.0.0.1:9/prod/", {}, scenario, Observations(started=time.time()))
        self.scheduled: dict[str, list[float]] = defaultdict(list)

    def _sender(self) -> None:
        while (item := self._work.get()) is not None:
            tenant, at = item
            self.scheduled[tenant].append(at)


def test_together_starts_every_tenant_at_zero() -> None:
    scenario = Scenario(tenants=5)
    assert scenario.first_sends() == dict.fromkeys(scenario.tenant_ids, 0.0)


def test_spread_draws_each_first_send_within_its_period_and_repeats_with_the_seed() -> None:
    scenario = Scenario(tenants=20, phases="spread", phase_seed=7)
    first = scenario.first_sends()
    assert set(first) == set(scenario.tenant_ids)
    assert all(0.0 <= at < 1.0 / scenario.rate(tenant, 0.0) for tenant, at in first.items())
    assert len(set(first.values())) == len(first)  # no two tenants in phase
    assert Scenario(tenants=20, phases="spread", phase_seed=7).first_sends() == first
    assert Scenario(tenants=20, phases="spread", phase_seed=8).first_sends() != first


def test_unknown_phases_is_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match="'sometimes'"):
        Scenario(phases="sometimes")  # type: ignore[arg-type]


@pytest.mark.parametrize("phases", ["together", "spread"])
def test_the_load_generator_follows_the_schedule(phases: str) -> None:
    # 4 quiet tenants at 2/s (0.5 s apart), the noisy one at 2/s too (no burst within the run).
    scenario = Scenario(
        tenants=5,
        quiet_rate=2.0,
        noisy_rate=2.0,
        baseline_s=2.6,
        burst_s=0.0,
        after_s=0.0,
        senders=2,
        phases=phases,  # type: ignore[arg-type]
    )
    generator = _Recording(scenario)
    generator.run()

    first = scenario.first_sends()
    for tenant in scenario.tenant_ids:
        times = generator.scheduled[tenant]
        assert times[0] == pytest.approx(first[tenant])
        gaps = [b - a for a, b in pairwise(times)]
        assert gaps == pytest.approx([0.5] * len(gaps))
        assert all(at < scenario.duration_s for at in times)
        assert len(times) >= 3
    starts = {generator.scheduled[tenant][0] for tenant in scenario.tenant_ids}
    assert (len(starts) == 1) is (phases == "together")
