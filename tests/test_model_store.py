"""`nexttok pull / list / rm / cp` and the model store, against a local stand-in for the hub's file
API (tests/fake_hub.py, reached through HF_ENDPOINT): never the network."""

from __future__ import annotations

import hashlib
import json

import pytest

from fake_hub import FakeHub
from nexttok.checkpoints import hub_pull, store
from nexttok.checkpoints.hub_pull import HubFile, PullError, choose_file
from nexttok.checkpoints.store import ModelName
from nexttok.cli import main

REPO = "test-org/Tiny-GGUF"


@pytest.fixture
def hub(tiny_ggufs, monkeypatch, tmp_path):
    """A fake hub holding REPO (and an mmproj file no pull may choose), HF_ENDPOINT pointed at it,
    and a model store of this test's own."""
    files = {**tiny_ggufs, "mmproj-tiny-F16.gguf": b"not a model"}
    with FakeHub({REPO: files}) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("NEXTTOK_MODELS", str(tmp_path / "models"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield fake


def _files(*paths: str) -> list[HubFile]:
    return [HubFile(p, 10, "0" * 64) for p in paths]


@pytest.mark.parametrize("text, display, repo", [
    ("hf.co/Org/Repo-GGUF:Q4_K_M", "hf.co/Org/Repo-GGUF:Q4_K_M", "Org/Repo-GGUF"),
    ("Org/Repo-GGUF:q8_0", "hf.co/Org/Repo-GGUF:q8_0", "Org/Repo-GGUF"),
    ("huggingface.co/Org/Repo", "hf.co/Org/Repo:latest", "Org/Repo"),
    ("https://hf.co/Org/Repo:F16", "hf.co/Org/Repo:F16", "Org/Repo"),
    ("mine", "mine:latest", ""),
    ("mine:v2", "mine:v2", ""),
])
def test_model_names(text, display, repo):
    name = ModelName.parse(text)
    assert (name.display, name.repo) == (display, repo)
    assert ModelName.parse(text.upper()).key == name.key  # names match in any case, as hub ids do


@pytest.mark.parametrize("text", ["a/b/c", "../x", "hf.co/onlyone", "a/..", "x:", "x:../y", "a b", "-x"])
def test_bad_model_names_say_what_a_name_is(text):
    with pytest.raises(ValueError, match="is not a model name|is not a tag"):
        ModelName.parse(text)


def test_quant_selection_follows_llama_cpp_and_ollama():
    name = ModelName.parse
    files = _files("m-Q8_0.gguf", "m-Q4_0.gguf", "m-Q4_K_M.gguf", "mmproj-m-F16.gguf", "README.md")
    assert choose_file(files, name("o/m")).path == "m-Q4_K_M.gguf"  # no tag: Q4_K_M
    assert choose_file(files, name("o/m:q8_0")).path == "m-Q8_0.gguf"  # any case
    assert choose_file(_files("m-Q8_0.gguf", "m-Q4_0.gguf"), name("o/m")).path == "m-Q4_0.gguf"  # another Q4
    assert choose_file(_files("m-Q8_0.gguf", "m-F16.gguf"), name("o/m:latest")).path == "m-F16.gguf"  # the first
    assert choose_file(_files("Q6_K/m.gguf", "m-Q6_K_L.gguf"), name("o/m:Q6_K")).path == "Q6_K/m.gguf"  # a word
    with pytest.raises(PullError, match=r"^hf.co/o/m has no GGUF file for Q5_K_M; it has Q4_0, Q4_K_M, Q8_0$"):
        choose_file(files, name("o/m:Q5_K_M"))
    with pytest.raises(PullError, match="no GGUF file"):
        choose_file(_files("model.safetensors", "mmproj-F16.gguf"), name("o/m"))
    with pytest.raises(PullError, match="one of 3 parts"):
        choose_file(_files("m-Q8_0-00001-of-00003.gguf"), name("o/m:Q8_0"))


def test_pull_stores_the_file_checked_and_it_runs_by_name(hub, tiny_ggufs, capsys):
    assert main(["pull", f"hf.co/{REPO}:q8_0"]) == 0
    captured = capsys.readouterr()
    assert f"pulled hf.co/{REPO}:q8_0 (tiny-Q8_0.gguf" in captured.out
    assert "success" in captured.err and "verifying sha256 digest" in captured.err
    manifest = store.find("test-org/tiny-gguf:Q8_0")  # either spelling, any case
    assert manifest is not None and manifest.blob.read_bytes() == tiny_ggufs["tiny-Q8_0.gguf"]
    assert manifest.sha256 == hashlib.sha256(tiny_ggufs["tiny-Q8_0.gguf"]).hexdigest()
    assert manifest.source["revision"] == "0123456789abcdef0123456789abcdef01234567"
    assert manifest.details["family"] == "llama" and manifest.details["quantization_level"] == "Q8_0"
    assert not list(manifest.blob.parent.glob("*.partial"))
    greedy = ["--temperature", "0", "--max-tokens", "4", "--json"]
    assert main(["run", f"{REPO}:Q8_0", "Hello", *greedy]) == 0
    by_name = [json.loads(line)["token_id"] for line in capsys.readouterr().out.splitlines()]
    assert main(["run", str(manifest.blob), "Hello", *greedy]) == 0
    assert by_name == [json.loads(line)["token_id"] for line in capsys.readouterr().out.splitlines()]


def test_no_tag_pulls_a_q4_never_the_mmproj(hub):
    manifest = hub_pull.pull(REPO)
    assert manifest.name == f"hf.co/{REPO}:latest" and manifest.source["file"] == "tiny-Q4_0.gguf"
    assert store.find(REPO) == store.find(f"hf.co/{REPO}:latest") is not None


def test_a_cut_download_resumes_where_it_stopped(hub, tiny_ggufs):
    data = tiny_ggufs["tiny-F16.gguf"]
    cut = len(data) // 3
    hub.cut = [cut, 0]  # the first response stops a third of the way; the retry gets nothing
    with pytest.raises(PullError) as stopped:
        hub_pull.pull(f"{REPO}:F16", retries=0)
    assert str(stopped.value) == (f"hf.co/{REPO}:F16: the download stopped at {cut} of {len(data)} bytes "
                                  f"(ConnectionResetError: connection closed after {cut} of {len(data)} bytes); "
                                  "pull again to resume")
    sha256 = hashlib.sha256(data).hexdigest()
    assert store.partial_path(sha256).stat().st_size == cut and store.find(f"{REPO}:F16") is None
    hub.requests.clear()
    manifest = hub_pull.pull(f"{REPO}:F16")
    assert hub.downloads() == [f"bytes={cut}-"]  # only the rest was asked for
    assert manifest.blob.read_bytes() == data and not store.partial_path(sha256).exists()


def test_a_cut_within_one_pull_is_resumed_by_that_pull(hub, tiny_ggufs):
    data = tiny_ggufs["tiny-Q4_0.gguf"]
    hub.cut = [1000, 5000]
    events = []
    manifest = hub_pull.pull(f"{REPO}:Q4_0", events.append)
    assert hub.downloads() == [None, "bytes=1000-", "bytes=6000-"]
    assert manifest.blob.read_bytes() == data
    done = [e.completed for e in events if e.total is not None]
    assert done[0] == 0 and done[-1] == len(data) == events[1].total and done == sorted(done)
    assert [e.status for e in events if e.total is None] == ["pulling manifest", "verifying sha256 digest",
                                                             "writing manifest", "success"]
    assert events[1].status == f"pulling {manifest.sha256[:12]}" and events[1].digest == f"sha256:{manifest.sha256}"


def test_a_server_that_ignores_range_sends_it_all_again(hub, tiny_ggufs):
    hub.cut, hub.ignore_range = [2000], True
    manifest = hub_pull.pull(f"{REPO}:Q4_0")
    assert manifest.blob.read_bytes() == tiny_ggufs["tiny-Q4_0.gguf"]


def test_a_sha256_mismatch_is_refused_in_one_line(hub, tiny_ggufs, capsys):
    hub.corrupt = True
    assert main(["pull", f"{REPO}:Q8_0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    sha256 = hashlib.sha256(tiny_ggufs["tiny-Q8_0.gguf"]).hexdigest()
    assert err.startswith(f"error: hf.co/{REPO}:Q8_0: sha256 mismatch for tiny-Q8_0.gguf (expected {sha256}, got ")
    assert err.endswith("); the download was removed, pull again")
    assert store.find(f"{REPO}:Q8_0") is None and not store.partial_path(sha256).exists()
    assert not store.blob_path(sha256).exists()


@pytest.mark.parametrize("name, says", [
    (f"{REPO}:Q5_K_M", f"error: hf.co/{REPO} has no GGUF file for Q5_K_M; it has F16, Q4_0, Q8_0"),
    ("test-org/nope:Q8_0", "error: hf.co/test-org/nope: the hub answered 401 Unauthorized (a private or gated "
                           "repo needs HF_TOKEN)"),
    ("mine", "error: 'mine' names no hub repository: pull hf.co/ORG/REPO[:QUANT] or ORG/REPO[:QUANT]"),
])
def test_pull_errors_are_one_line(hub, capsys, name, says):
    assert main(["pull", name]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == says


def test_run_pulls_a_hub_name_it_does_not_have(hub, capsys):
    assert main(["run", f"hf.co/{REPO}:F16", "Hi", "--temperature", "0", "--max-tokens", "2"]) == 0
    assert "is not stored yet: pulling it" in capsys.readouterr().err
    assert store.find(f"{REPO}:F16") is not None


def test_list_cp_and_rm_as_ollama(hub, tiny_ggufs, capsys):
    assert main(["list"]) == 0
    assert capsys.readouterr().out.split() == ["NAME", "ID", "SIZE", "MODIFIED"]  # nothing stored yet
    q8 = hub_pull.pull(f"{REPO}:Q8_0")
    q4 = hub_pull.pull(f"hf.co/{REPO}:Q4_0")
    assert main(["cp", f"{REPO}:Q8_0", "mine"]) == 0
    assert capsys.readouterr().out.strip() == f"copied 'hf.co/{REPO}:Q8_0' to 'mine:latest'"
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    rows = [line.split("    ") for line in lines[1:]]
    rows = [[cell.strip() for cell in row if cell.strip()] for row in rows]
    assert [r[0] for r in rows] == ["mine:latest", f"hf.co/{REPO}:Q4_0", f"hf.co/{REPO}:Q8_0"]  # newest first
    assert rows[2][1] == q8.sha256[:12] and rows[1][1] == q4.sha256[:12] and rows[0][1] == q8.sha256[:12]
    assert rows[0][2].endswith((" KB", " MB")) and rows[0][3].endswith("ago")
    assert main(["rm", f"{REPO}:q8_0"]) == 0  # the file stays: mine uses it
    assert capsys.readouterr().out.strip() == f"deleted 'hf.co/{REPO}:Q8_0'"
    assert q8.blob.is_file() and store.find("mine").blob == q8.blob
    assert main(["rm", "mine", f"{REPO}:Q4_0"]) == 0  # now no name uses either file
    assert not q8.blob.exists() and not q4.blob.exists() and store.models() == []
    assert not (q8.root / "manifests" / "hf.co").exists()  # no empty folders left behind
    assert main(["rm", "mine"]) == 2
    assert capsys.readouterr().err.strip() == "error: model 'mine' not found (`nexttok list` shows the stored models)"


@pytest.mark.parametrize("seconds, says", [(0.5, "Less than a second ago"), (1, "1 second ago"),
                                           (45, "45 seconds ago"), (90, "About a minute ago"),
                                           (600, "10 minutes ago"), (4000, "About an hour ago"),
                                           (86400 * 3, "3 days ago"), (86400 * 20, "2 weeks ago")])
def test_moments_as_ollama_writes_them(seconds, says):
    from nexttok.cli.store import human_ago, human_bytes

    assert human_ago(seconds) == says
    assert human_bytes(4_661_224_676) == "4.7 GB" and human_bytes(397_000_000) == "397 MB"
