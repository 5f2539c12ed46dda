"""schemathesis against the server's own /openapi.json on loopback: no 5xx, and every response
(status, content type, body) as the spec says. A bounded count here; scripts/fuzz_server.py runs
thousands."""

from __future__ import annotations

from fuzz_target import fuzz, fuzz_server


def test_every_route_keeps_to_its_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("NEXTTOK_MODELS", str(tmp_path / "models"))  # fuzz_server sets it: restored after
    with fuzz_server(tmp_path) as live:
        cases = fuzz(live.url, max_examples=15)
    assert cases >= 100
