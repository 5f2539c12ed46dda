"""The server the fuzz test and scripts/fuzz_server.py attack: a tiny model with tight limits, so
thousands of generated requests stay fast (prompt + completion at most 64 tokens)."""

from __future__ import annotations

import os
from pathlib import Path

from live_server import LiveServer
from nexttok.checkpoints.bundled import tokenizer_dir
from nexttok.server import ServerLimits, create_app, load_served
from tiny_models import write_chat_model

CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance")


def fuzz_server(directory: Path) -> LiveServer:
    os.environ["NEXTTOK_MODELS"] = str(directory / "models")  # what /api/copy and /api/delete reach: a store of its own
    write_chat_model(directory, tokenizer_dir("gpt2"))
    served = load_served(str(directory), "tiny")
    limits = ServerLimits(max_running=4, max_queue=256, request_timeout=30, max_model_len=64,
                          max_body_bytes=64 << 10)
    return LiveServer(create_app([served], limits=limits))


def check_functions():
    import schemathesis.checks as checks

    return [getattr(checks, name) for name in CHECKS]


def fuzz(url: str, max_examples: int, on_error=None) -> int:
    """Run schemathesis on every operation of url's /openapi.json; returns how many cases ran.
    A failing check raises (hypothesis shrinks it first), unless on_error(operation, exc) is given."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings

    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    checks = check_functions()
    count = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if "501" in operation.definition.raw.get("responses", {}):
            continue  # documented as not implemented (Ollama's model management): its one answer is that 501
        if operation.path == "/api/pull":
            continue  # it reaches the hub (test_model_server.py drives it against a local stand-in)

        @settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate, Phase.shrink])
        @given(case=operation.as_strategy())
        def run(case):
            nonlocal count
            count += 1
            case.call_and_validate(checks=checks, timeout=60)

        try:
            run()
        except Exception as e:
            if on_error is None:
                raise
            on_error(operation, e)
    return count
