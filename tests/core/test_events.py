"""The events are frozen dataclasses whose constructor writes their slots directly."""

from __future__ import annotations

import dataclasses

import pytest

from deadlines import _events

EVENTS = [
    _events.CallStarted("db", 1.5),
    _events.CallFinished("db", "timeout", 0.25, 1.5, phase="headers", pool_wait=0.01),
    _events.RequestStarted("/items/{id}", 2.0),
    _events.RequestFinished("/items/{id}", "ok", 0.1, 2.0),
    _events.JobDropped("emails", 3.0),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_every_field_is_set_and_frozen(event: _events.Event) -> None:
    """Each field holds what was passed (positionally or by name) and cannot be reassigned."""
    values = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    assert type(event)(**values) == event
    assert type(event)(*values.values()) == event
    assert hash(type(event)(**values)) == hash(event)
    for name in values:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(event, name, None)


def test_defaults_and_missing_arguments() -> None:
    """Defaults are the dataclass's; a missing or unknown argument is a TypeError."""
    event = _events.CallFinished("db", "ok", 0.1, 1.0)
    assert (event.phase, event.pool_wait, event.request_sent, event.limit) == (None,) * 4
    assert event.error is None and event.started is True
    assert dataclasses.replace(event, outcome="error").outcome == "error"
    with pytest.raises(TypeError, match="budget"):
        _events.CallFinished("db", "ok", 0.1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="colour"):
        _events.CallStarted("db", 1.0, colour="red")  # type: ignore[call-arg]
