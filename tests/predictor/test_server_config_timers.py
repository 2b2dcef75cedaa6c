"""`lpc serve`'s timers (batch wait, request and shutdown timeouts) are checked when the
settings are made: a value past a day, NaN or a batch wait that outlasts the request timeout
is one line naming the field, its value and the range (issue 44's siblings of case 7)."""

from __future__ import annotations

import pytest

from predictor.errors import InvalidInputError
from predictor.server_config import ServerConfig


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("request_timeout_s", 1e10, "must be a number in [0, 86400], got 10000000000.0"),
        ("graceful_timeout_s", 1e10, "must be a number in [0, 86400]"),
        ("graceful_timeout_s", float("nan"), "must be a number in [0, 86400]"),
        ("max_wait_ms", 1e11, "must be a number in [0, 8.64e+07]"),
        ("max_wait_ms", True, "must be a number in [0, 8.64e+07]"),
        ("max_wait_ms", 30_000.0, "must be below request_timeout_s (in ms), got 30000.0"),
    ],
)
def test_a_timer_out_of_range_is_refused(field: str, value: float, fragment: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        ServerConfig(**{field: value})
    assert str(caught.value).startswith(f"ServerConfig.{field} ") and fragment in str(caught.value)


def test_the_longest_timers_are_accepted() -> None:
    config = ServerConfig(request_timeout_s=86_400, graceful_timeout_s=86_400, max_wait_ms=1000)
    assert config.request_timeout_s == 86_400


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"url": "http://127.0.0.1:notaport"}, "url is not a valid URL"),
        ({"timeout_s": 1e10}, "timeout_s must be in (0, 86400] seconds, got 10000000000.0"),
        ({"overload_backoff_s": -1.0}, "overload_backoff_s must be in [0, 86400] seconds"),
    ],
)
def test_the_load_test_checks_its_url_and_timers(changes: dict, message: str) -> None:
    from lpc.benchmarks.load_test import LoadTestConfig

    with pytest.raises(ValueError) as caught:
        LoadTestConfig(**{"url": "http://127.0.0.1:8476", **changes})
    assert message in str(caught.value)
