"""The console's HTTP client against a fake appliance on loopback: the contract, and every failure as a message."""

from __future__ import annotations

import pytest

from admin_ui.client import (
    ApplianceClient,
    BadResponse,
    Unreachable,
    normalize_url,
    parse_server_timing,
    probe,
)
from tests.test_console_support import closed_port_url, fake_appliance


@pytest.mark.parametrize(
    ("raw", "url"),
    [
        ("localhost:8080", "http://localhost:8080"),
        (" http://10.0.0.5:8080/ ", "http://10.0.0.5:8080"),
        ("https://hare.example", "https://hare.example"),
    ],
)
def test_normalize_url(raw: str, url: str) -> None:
    assert normalize_url(raw) == url


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("", "empty"),
        ("ftp://x", "http://"),
        ("http://", "no host"),
        ("h:x", "port"),
        # taken, then every page that reached it failed on idna's UnicodeError, the Overview with no Remove
        (f"http://{'a' * 64}.example:8080", "invalid host name"),
        ("x" * 3000, "invalid host name"),
    ],
)
def test_normalize_url_names_the_problem(raw: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        normalize_url(raw)


def test_parse_server_timing() -> None:
    header = 'tokenize;dur=0.21, queue;dur=0.05, inference;desc="ort";dur=1.9, postprocess;dur=x, total'
    assert parse_server_timing(header) == {"tokenize": 0.21, "queue": 0.05, "inference": 1.9}
    assert parse_server_timing(None) == {}


def test_info_and_predict_follow_the_contract() -> None:
    with fake_appliance("text-classification") as fake, ApplianceClient(fake.url) as client:
        assert client.health() and client.ready()
        assert client.info()["task"] == "text-classification"
        prediction = client.predict("great", {"top_k": None})
    assert prediction.output[0] == {"label": "POSITIVE", "score": 0.87}
    assert prediction.compute_time_s == pytest.approx(0.0022)
    assert prediction.phases_ms == {"tokenize": 0.21, "queue": 0.05, "inference": 1.9, "postprocess": 0.04}
    assert prediction.round_trip_s > 0
    assert fake.requests == [{"inputs": "great", "parameters": {"top_k": None}}]


def test_unreachable_url_is_a_sentence() -> None:
    url = closed_port_url()
    with (
        ApplianceClient(url, timeout=2) as client,
        pytest.raises(Unreachable, match=r"cannot reach .* `hare serve` running"),
    ):
        client.info()
    p = probe(url)
    assert p.error and "cannot reach" in p.error and p.info is None


def test_server_of_another_kind_is_named() -> None:
    with fake_appliance(mode="html") as fake, ApplianceClient(fake.url) as client:
        with pytest.raises(BadResponse, match="is this a hare appliance"):
            client.info()
        with pytest.raises(BadResponse, match="404"):
            client.predict("x")


def test_appliance_of_an_unknown_task_is_refused() -> None:
    with (
        fake_appliance("summarization") as fake,
        ApplianceClient(fake.url) as client,
        pytest.raises(BadResponse, match="serves task 'summarization', which this console does not know"),
    ):
        client.info()


def test_server_error_body_is_passed_on() -> None:
    with (
        fake_appliance(mode="error") as fake,
        ApplianceClient(fake.url) as client,
        pytest.raises(BadResponse, match=r"input_too_long\): input 0 has 900 tokens") as caught,
    ):
        client.predict("x")
    assert caught.value.status == 422 and caught.value.kind == "input_too_long"


def test_appliance_token_is_sent_as_bearer() -> None:
    with fake_appliance(token="s3cret") as fake:
        with ApplianceClient(fake.url) as client, pytest.raises(BadResponse, match="unauthorized"):
            client.info()
        with ApplianceClient(fake.url, token="s3cret") as client:
            assert client.info()["task"] == "text-classification"
            assert client.metrics_text().startswith("# HELP")


def test_the_api_key_goes_to_predict_and_the_admin_token_elsewhere() -> None:
    # An appliance whose HARE_API_KEY differs from its HARE_ADMIN_TOKEN refused the Playground's every text: the
    # console sent the admin token, and said to give it the admin token it had.
    with fake_appliance(token="adm", api_key="k3y") as fake:
        with ApplianceClient(fake.url, token="adm") as client:
            assert client.info()["task"] == "text-classification"
            with pytest.raises(BadResponse) as caught:
                client.predict("great")
        with ApplianceClient(fake.url, token="adm", api_key="k3y") as client:
            assert client.info()["task"] == "text-classification"
            assert client.predict("great").output[0] == {"label": "POSITIVE", "score": 0.87}
    assert caught.value.status == 401 and str(caught.value).endswith(
        "; give the console the appliance's API key (HARE_CONSOLE_APPLIANCE_API_KEY or HARE_API_KEY)"
    )


def test_probe_describes_a_healthy_appliance() -> None:
    with fake_appliance("text-ranking") as fake:
        p = probe(fake.url)
    assert (p.healthy, p.ready, p.error) == (True, True, None)
    assert p.info is not None and p.info["task"] == "text-ranking"


def test_probe_rejects_a_bad_url_without_raising() -> None:
    assert probe("ftp://nowhere").error == "'ftp://nowhere': an appliance URL starts with http:// or https://"
