"""The replay block a failure prints is Python that reproduces the run: same settings, same commands."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statemachine import ReplicaReady, RequestArrived, Settings, Tick, initial_state, run

from .replay import replay_code
from .strategies import scheduler_settings


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(config=scheduler_settings(), data=st.data())
def test_replay_code_reproduces_the_run(
    config: Settings, data: st.DataObject, capsys: pytest.CaptureFixture[str]
) -> None:
    targets = sorted(config.models)
    events = [Tick(0.5)]
    events += [RequestArrived(i, data.draw(st.sampled_from(targets)), None) for i in range(1, 4)]
    _, expected = run(initial_state(config), events)
    spawned = [c.replica for c in expected if type(c).__name__ == "Spawn"]
    events += [ReplicaReady(r) for r in spawned[:1]]
    final, expected = run(initial_state(config), events)

    namespace: dict[str, object] = {}
    exec(compile(replay_code(config, events), "<replay>", "exec"), namespace)
    capsys.readouterr()  # the replay prints every step; reset between examples
    assert namespace["settings"] == config
    assert namespace["events"] == events
    assert namespace["state"] == final
