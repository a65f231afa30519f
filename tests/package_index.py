"""A PEP 503 package index on 127.0.0.1 (``http.server``) holding a few pure-Python wheels written here,
for the tests that build a job's Python environment; machines reach it through their ``index_url``
option (or a job's ``UV_DEFAULT_INDEX``), so no test uses the public index.

Use the fixture in a test module with ``index = package_index.index``; ``notebook_index`` holds the
notebook runner's packages (nbclient, ipykernel and what they need), made from this interpreter's.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import importlib.metadata
import re
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def wheel(folder: Path, name: str, version: str, body: str, requires: tuple[str, ...] = ()) -> None:
    """A pure-Python wheel with one module, written as the zip it is."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": body,
        f"{info}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


def core_metadata(wheel: Path) -> str:
    """The index link's attribute naming a wheel's metadata file (PEP 714), where there is one."""
    meta = wheel.with_name(wheel.name + ".metadata")
    return f' data-core-metadata="sha256={hashlib.sha256(meta.read_bytes()).hexdigest()}"' if meta.is_file() else ""


class Index:
    """The test's package index; ``hold`` makes requests for one project wait until ``release``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.held: str | None = None
        self.uv_cache = root
        self.asked = threading.Event()
        self.gate = threading.Event()
        index = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):  # type: ignore[no-untyped-def]
                super().__init__(*a, directory=str(root), **kw)

            def do_GET(self) -> None:
                # a wheel's metadata (PEP 658) is the resolution's: only the download itself waits
                if index.held and f"/{index.held}" in self.path and not self.path.endswith(".metadata"):
                    index.asked.set()
                    index.gate.wait(120)
                super().do_GET()

            def log_message(self, *a) -> None:  # type: ignore[no-untyped-def]
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def hold(self, project: str) -> None:
        self.held, self.asked, self.gate = project, threading.Event(), threading.Event()

    def release(self) -> None:
        self.held = None
        self.gate.set()

    def stop(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    root = tmp_path_factory.mktemp("index")
    uv_cache = tmp_path_factory.mktemp("uv-cache")  # the built-in machine's uv: a cache of this run's own
    files = root / "files"
    files.mkdir()
    wheel(files, "rcdemo-a", "1.0", "VALUE = 'a1'\n")
    wheel(files, "rcdemo-a", "2.0", "VALUE = 'a2'\n")
    wheel(files, "rcdemo-b", "1.0", "from rcdemo_a import VALUE as A\n", requires=("rcdemo-a==1.0",))
    wheel(files, "rcdemo-c", "1.0", "")
    wheel(files, "rcdemo-slow", "1.0", "")
    # a compiled package's only wheel: this side's platform, no other
    wheel(files, "rcdemo-native", "1.0", "")
    native = files / "rcdemo_native-1.0-py3-none-any.whl"
    native.rename(files / "rcdemo_native-1.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    # Two with their metadata beside the wheel (PEP 658): uv resolves them without downloading a wheel.
    wheel(files, "rcdemo-top", "1.0", "", requires=("rcdemo-dep",))
    wheel(files, "rcdemo-dep", "1.0", "")
    for built in (*files.glob("rcdemo_top-*.whl"), *files.glob("rcdemo_dep-*.whl")):
        with zipfile.ZipFile(built) as z:
            metadata = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
        built.with_name(built.name + ".metadata").write_bytes(metadata)
    for project in ("rcdemo-a", "rcdemo-b", "rcdemo-c", "rcdemo-slow", "rcdemo-native", "rcdemo-top", "rcdemo-dep"):
        (root / "simple" / project).mkdir(parents=True)
        links = "".join(
            f'<a href="../../files/{w.name}"{core_metadata(w)}>{w.name}</a>\n'
            for w in sorted(files.glob(project.replace("-", "_") + "-*.whl"))
        )
        (root / "simple" / project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    served = Index(root)
    served.uv_cache = uv_cache
    yield served
    served.stop()


def installed_wheel(dist: importlib.metadata.Distribution, folder: Path) -> None:
    """A wheel of an installed distribution, written back from its RECORD: the files it installed into
    site-packages (not its scripts), with the tag its WHEEL file names for this Python."""
    wheel_text = dist.read_text("WHEEL") or ""
    tags = [t.split(":", 1)[1].strip() for t in wheel_text.splitlines() if t.startswith("Tag:")]
    tag = next(t for t in tags if t.startswith(("py3", "cp3")))
    name, version = re.sub(r"[-_.]+", "_", dist.metadata["Name"]).lower(), dist.version
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{name}-{version}-{tag}.whl", "w", zipfile.ZIP_DEFLATED) as z:
        record = []
        for f in dist.files or []:
            rel = str(f)
            if rel.startswith("..") or "__pycache__" in rel or rel.endswith(("RECORD", "INSTALLER", "direct_url.json")):
                continue
            data = Path(dist.locate_file(f)).read_bytes()
            if ".dist-info/" in rel:
                rel = f"{info}/{rel.split('.dist-info/', 1)[1]}"
            z.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{rel},sha256={digest},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")


def closure(names: list[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``names`` need, with what they need, markers taken as this Python's."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        key = canonicalize_name(todo.pop())
        if key in seen:
            continue
        seen[key] = dist = importlib.metadata.distribution(key)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


@pytest.fixture(scope="module")
def notebook_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    """An index holding the notebook runner's packages, made from this interpreter's installed ones."""
    root = tmp_path_factory.mktemp("nb-index")
    files = root / "files"
    files.mkdir()
    for dist in closure(["nbclient", "ipykernel"]):
        installed_wheel(dist, files)
    projects: dict[str, list[str]] = {}
    for w in files.glob("*.whl"):
        projects.setdefault(w.name.split("-", 1)[0].replace("_", "-"), []).append(w.name)
    for project, wheels in projects.items():
        (root / "simple" / project).mkdir(parents=True)
        links = "".join(f'<a href="../../files/{w}">{w}</a>\n' for w in wheels)
        (root / "simple" / project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    served = Index(root)
    yield served
    served.stop()
