"""The predictor client's URL is checked where it is given (issue 44, case 12): a malformed
one is a ValueError saying what is wrong, not an `httpx.InvalidURL` at the first request."""

from __future__ import annotations

import pytest

from predictor.client import PredictorClient, check_predictor_url


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://127.0.0.1:notaport", "is not a valid URL"),
        ("http://127.0.0.1:70000", "is not a valid URL"),
        ("http://127.0.0.1:0", "port must be in [1, 65535]"),
        ("http://:8100", "has no host"),
        ("127.0.0.1:8100", "must be an http:// or https:// URL"),
        ("ftp://127.0.0.1", "must be an http:// or https:// URL"),
        (None, "must be an http:// or https:// URL"),
    ],
)
def test_a_malformed_url_is_one_clear_error(url: object, fragment: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_predictor_url(url)
    assert fragment in str(caught.value) and repr(url) in str(caught.value)


def test_the_client_names_its_base_url() -> None:
    with pytest.raises(ValueError, match=r"^base_url is not a valid URL .*'http://127.0.0.1:x'"):
        PredictorClient("http://127.0.0.1:x")


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8100", "https://predictor.internal/lpc/", "http://[::1]:8100"]
)
def test_good_urls_pass_unchanged(url: str) -> None:
    assert check_predictor_url(url) == url
    PredictorClient(url).close()
