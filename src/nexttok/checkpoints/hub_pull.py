"""`nexttok pull`: one GGUF file of a Hugging Face repo into the model store (store.py), as `ollama
pull hf.co/ORG/REPO:QUANT` and llama.cpp's `-hf ORG/REPO:QUANT` fetch it.

    pull("hf.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", progress=print)

1. the repo's files, with their sizes and the sha256 the hub keeps for each LFS file:
   GET $HF_ENDPOINT/api/models/ORG/REPO/revision/main?blobs=true (HfApi.model_info's request)
2. the file the tag names (choose_file): the .gguf whose name holds QUANT as a word
   (Qwen2.5-0.5B-Instruct-Q4_K_M.gguf), in any case; no tag (or `latest`): Q4_K_M, else another Q4,
   else the first GGUF, as the hub answers llama.cpp and Ollama. mmproj files are never chosen; a
   model split in parts is refused by name
3. the bytes, from the commit the listing named, into blobs/sha256-<hex>.gguf.partial: a cut
   download resumes where it stopped (HTTP Range), within this pull (a few tries) or the next one;
   the sha256 is computed as the bytes arrive (the partial's own bytes first), and a mismatch
   removes the partial and refuses in one line
4. the manifest, written last: a name is stored only with its whole, checked file

Written over the standard library's urllib rather than huggingface_hub's hf_hub_download: that
resumes too, but checks no sha256 (a damaged or truncated-and-padded file of the right size is
kept), reports progress through tqdm only (we need a rich bar on the terminal and Ollama's NDJSON
events on /api/pull), and keeps files in the HF cache's layout rather than the store's.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from nexttok.checkpoints import store
from nexttok.checkpoints.store import Manifest, ModelName
from nexttok.home import cache_home

HF_ENDPOINT = "https://huggingface.co"
CHUNK = 1 << 20
TIMEOUT = 30.0  # seconds without a byte before a try is given up (and resumed)
DEFAULT_QUANT = "Q4_K_M"
QUANT = re.compile(r"(?i)(?:^|[-._/])((?:I?Q[1-8](?:_[A-Z0-9]+)*)|BF16|F16|F32)(?=[-._/]|$)")
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


class PullError(OSError):
    """A pull that cannot finish; its message is one line, naming the model."""


class NothingToPull(PullError):
    """The hub has no such repo (or not for us: private, gated), or no GGUF file the tag names."""


@dataclass(frozen=True)
class HubFile:
    path: str  # in the repo
    size: int
    sha256: str | None  # the hub's LFS oid; None for a file kept in git itself


@dataclass(frozen=True)
class Progress:
    """One step of a pull, in Ollama's words (its /api/pull events): status, and for the download
    the digest with bytes completed of total."""

    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None


Report = Callable[[Progress], None]


def endpoint() -> str:
    """The hub's address: $HF_ENDPOINT (a mirror, or a test's local server), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or HF_ENDPOINT).rstrip("/")


def pull(name: str, progress: Report | None = None, *, retries: int = 3, root: Path | None = None) -> Manifest:
    """Download the GGUF file a hub name points at into the store and store the name (above)."""
    report = progress or (lambda _: None)
    wanted = ModelName.parse(name)
    if not wanted.host:
        raise PullError(f"{name!r} names no hub repository: pull hf.co/ORG/REPO[:QUANT] or ORG/REPO[:QUANT]")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise PullError(f"cannot pull {wanted.display}: HF_HUB_OFFLINE is set")
    report(Progress("pulling manifest"))
    repo, commit, files = repo_files(wanted.repo)
    wanted = ModelName(wanted.host, *repo.split("/"), wanted.tag)  # as the hub spells it
    chosen = choose_file(files, wanted)
    if chosen.sha256 is None:
        raise PullError(f"{wanted.display}: the hub gives no sha256 for {chosen.path} (not an LFS file)")
    blob = store.blob_path(chosen.sha256, root)
    if not blob.is_file():
        url = f"{endpoint()}/{wanted.repo}/resolve/{commit}/{urllib.parse.quote(chosen.path)}"
        download(url, chosen, store.partial_path(chosen.sha256, root), report, retries=retries, what=wanted.display)
    else:
        report(Progress(f"pulling {chosen.sha256[:12]}", f"sha256:{chosen.sha256}", chosen.size, chosen.size))
    report(Progress("writing manifest"))
    source = {"endpoint": endpoint(), "repo": wanted.repo, "revision": commit, "file": chosen.path}
    manifest = store.write(Manifest(wanted.display, chosen.sha256, chosen.size, source,
                                    gguf_details(blob, chosen.path)), root)
    report(Progress("success"))
    return manifest


def repo_files(repo: str) -> tuple[str, str, list[HubFile]]:
    """(the repo's id as the hub spells it, the commit main points at, its files with sizes and
    LFS sha256s)."""
    url = f"{endpoint()}/api/models/{repo}/revision/main?blobs=true"
    try:
        with _open(url) as response:
            import json

            info = json.loads(response.read())
    except urllib.error.HTTPError as e:
        if e.code in (401, 403, 404):
            raise NothingToPull(f"hf.co/{repo}: the hub answered {e.code} {e.reason} (a private or gated repo "
                                "needs HF_TOKEN)") from None
        raise PullError(f"hf.co/{repo}: the hub answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise PullError(f"hf.co/{repo}: cannot list its files at {endpoint()} ({_reason(e)})") from None
    files = []
    for sibling in info.get("siblings") or []:
        lfs = sibling.get("lfs") or {}
        files.append(HubFile(sibling["rfilename"], int(lfs.get("size", sibling.get("size") or 0)),
                             lfs.get("sha256") or lfs.get("oid")))
    canonical = str(info.get("id") or repo)
    return canonical if canonical.count("/") == 1 else repo, str(info.get("sha") or "main"), files


def choose_file(files: list[HubFile], name: ModelName) -> HubFile:
    """The GGUF file a tag names (see the module's docstring); PullError listing the quantizations
    there are when none matches. choose_file([a-Q8_0.gguf, a-Q4_K_M.gguf], :latest) -> a-Q4_K_M.gguf."""
    ggufs = sorted((f for f in files if f.path.lower().endswith(".gguf")
                    and not f.path.rsplit("/", 1)[-1].lower().startswith("mmproj")), key=lambda f: f.path)
    if not ggufs:
        raise NothingToPull(f"hf.co/{name.repo} has no GGUF file (a safetensors repo loads by its id: "
                        f"nexttok run {name.repo})")
    if name.tag.lower() == "latest":
        chosen = (_tagged(ggufs, DEFAULT_QUANT) or [f for f in ggufs if _quant(f.path).upper().startswith("Q4")]
                  or ggufs)[0]
    else:
        matches = _tagged(ggufs, name.tag)
        if not matches:
            there = sorted({_quant(f.path) or f.path for f in ggufs})
            raise NothingToPull(f"hf.co/{name.repo} has no GGUF file for {name.tag}; it has {', '.join(there)}")
        chosen = matches[0]
    split = SPLIT.search(chosen.path)
    if split:
        raise PullError(f"{name.display}: {chosen.path} is one of {int(split.group(2))} parts; nexttok reads a "
                        "GGUF in one file (join them with llama.cpp's llama-gguf-split --merge)")
    return chosen


def _tagged(files: list[HubFile], tag: str) -> list[HubFile]:
    """The files whose path holds tag as a word: -Q4_K_M., /Q4_K_M/ (any case)."""
    word = re.compile(rf"(?i)(?:^|[-._/]){re.escape(tag)}(?=[-._/]|$)")
    return [f for f in files if word.search(f.path)]


def _quant(path: str) -> str:
    """A file's quantization as its name writes it: _quant("m-Q4_K_M.gguf") == "Q4_K_M"."""
    found = QUANT.findall(path.removesuffix(".gguf"))
    return found[-1] if found else ""


def download(url: str, file: HubFile, partial: Path, report: Report, *, retries: int, what: str) -> Path:
    """file's bytes from url into partial, resumed where a partial stops, then renamed to the
    blob (partial less .partial) once size and sha256 check out."""
    assert file.sha256 is not None
    digest, label = f"sha256:{file.sha256}", f"pulling {file.sha256[:12]}"
    partial.parent.mkdir(parents=True, exist_ok=True)
    with open(partial, "ab+") as out:
        _lock(out, what)
        sink = _Sink(out, file.size)
        report(Progress(label, digest, file.size, sink.done))
        failures = 0
        while sink.done < file.size:
            before = sink.done
            try:
                _fetch(url, sink, lambda done: report(Progress(label, digest, file.size, done)))
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                if isinstance(e, PullError):
                    raise
                failures = 0 if sink.done > before else failures + 1
                if failures > retries:
                    raise PullError(f"{what}: the download stopped at {sink.done} of {file.size} bytes "
                                    f"({_reason(e)}); pull again to resume") from None
                time.sleep(min(0.2 * failures, 2.0))
        report(Progress("verifying sha256 digest"))
        found = sink.hasher.hexdigest()
    if found != file.sha256:
        partial.unlink(missing_ok=True)
        raise PullError(f"{what}: sha256 mismatch for {file.path} (expected {file.sha256}, got {found}); the "
                        "download was removed, pull again")
    blob = partial.with_name(partial.name.removesuffix(".partial"))
    os.replace(partial, blob)
    return blob


class _Sink:
    """The partial file and the sha256 of what it holds so far (its own bytes hashed on opening)."""

    def __init__(self, out, size: int):
        self.out, self.size = out, size
        out.seek(0, os.SEEK_END)
        if out.tell() > size:  # not a prefix of this file
            out.truncate(0)
        self.restart(keep=True)

    def restart(self, keep: bool = False) -> None:
        """Hash what is kept, or (keep=False) empty the file: the bytes come from the start again."""
        self.hasher = hashlib.sha256()
        if not keep:
            self.out.truncate(0)
        self.out.seek(0)
        while block := self.out.read(CHUNK):
            self.hasher.update(block)
        self.done = self.out.tell()

    def write(self, block: bytes) -> None:
        if self.done + len(block) > self.size:
            raise PullError(f"the hub sent more than the {self.size} bytes it listed")
        self.out.write(block)
        self.hasher.update(block)
        self.done += len(block)


def _fetch(url: str, sink: _Sink, done: Callable[[int], None]) -> None:
    """One try: the bytes from the partial's end on, appended and hashed as they come. A server
    that ignores Range (200 to a ranged request) sends the file from the start."""
    start = sink.done
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-"} if start else {})
    try:
        response = _open(request)
    except urllib.error.HTTPError as e:
        if e.code == 416 and start >= sink.size:  # nothing left to send: the partial is whole
            return
        if e.code >= 500:
            raise  # a hub having trouble: tried again
        raise PullError(f"{url}: the hub answered {e.code} {e.reason}") from None
    with response:
        if start and response.status != 206:
            sink.restart()
        while block := response.read(CHUNK):
            sink.write(block)
            done(sink.done)
    sink.out.flush()
    if sink.done < sink.size:  # the server closed early without an error: resume
        raise ConnectionResetError(f"connection closed after {sink.done} of {sink.size} bytes")


def _lock(out, what: str) -> None:
    """One pull of a file at a time: a second one would interleave its bytes with the first's."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no advisory locks; concurrent pulls are the user's risk
        return
    try:
        fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise PullError(f"{what}: another pull of this file is running") from None


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Redirects keep the token only on the hub's own host (the file's CDN gets a signed URL)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def _open(request: str | urllib.request.Request):
    request = request if isinstance(request, urllib.request.Request) else urllib.request.Request(request)
    request.add_header("User-Agent", f"nexttok/{_version()}")
    token = _token()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    return urllib.request.build_opener(_SameHostAuth).open(request, timeout=TIMEOUT)


def _token() -> str | None:
    """HF_TOKEN, else the token `hf auth login` saved (huggingface_hub knows where)."""
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"]
    with contextlib.suppress(Exception):
        from huggingface_hub import get_token

        return get_token()
    return None


def _version() -> str:
    try:
        return metadata.version("nexttok")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "dev"


def _reason(error: BaseException) -> str:
    reason = getattr(error, "reason", None) or error
    return f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__


def gguf_details(path: Path, file: str) -> dict:
    """What `nexttok list` and /api/tags show of a stored file without loading it: family,
    parameter count and the type most weight matrices are kept in (from the GGUF's header alone)."""
    details = {"format": "gguf", "file": file}
    with contextlib.suppress(Exception):  # a header nexttok cannot read: the file is kept, its details blank
        from nexttok.checkpoints.gguf.metadata import read_metadata

        meta, entries = read_metadata(path, cache_home() / "gguf")
        kinds: dict[str, int] = {}
        for entry in entries:
            if len(entry.dims) > 1:
                kinds[entry.kind] = kinds.get(entry.kind, 0) + 1
        count = 0
        for entry in entries:
            n = 1
            for d in entry.dims:
                n *= d
            count += n
        details.update(family=str(meta.get("general.architecture", "")), parameter_count=count,
                       quantization_level=max(kinds, key=kinds.get) if kinds else "")
    return details
