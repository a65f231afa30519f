"""A PEP 503 package index on 127.0.0.1 (``http.server``) holding a few pure-Python wheels written here,
for the tests that build a job's Python environment; machines reach it through their ``index_url``
option (or a job's ``UV_DEFAULT_INDEX``), so no test uses the public index.

Use the fixture in a test module with ``index = package_index.index``; ``notebook_index`` holds the
notebook runner's packages (nbclient, ipykernel and what they need), made from this interpreter's;
``tls_index`` serves the same wheels over HTTPS with a certificate from a private CA of its own
(``PrivateCA``), as an index behind a company proxy that inspects TLS is seen.
"""

from __future__ import annotations

import base64
import datetime
import ensurepip
import hashlib
import http.server
import importlib.metadata
import ipaddress
import re
import shutil
import ssl
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


class PrivateCA:
    """A CA of the test's own (``ca``, PEM) and a server certificate it signed for 127.0.0.1 (``server``,
    certificate and key); ``bundle`` holds the system's roots and this CA, as a machine that trusts it has."""

    def __init__(self, folder: Path) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        now = datetime.datetime.now(datetime.timezone.utc)
        ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())

        def named(cn: str) -> x509.Name:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

        def built(subject: str, public: object, issuer: str) -> x509.CertificateBuilder:
            return (
                x509.CertificateBuilder()
                .subject_name(named(subject))
                .issuer_name(named(issuer))
                .public_key(public)  # type: ignore[arg-type]
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
            )

        usage = dict.fromkeys(("content_commitment", "key_encipherment", "data_encipherment", "key_agreement"), False)
        ca = (
            built("jrc test CA", ca_key.public_key(), "jrc test CA")
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                    **usage,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        cert = (
            built("127.0.0.1", key.public_key(), "jrc test CA")
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        self.ca = folder / "ca.pem"
        self.ca.write_bytes(ca.public_bytes(pem))
        self.server = folder / "server.pem"
        self.server.write_bytes(
            cert.public_bytes(pem)
            + key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )
        self.server.chmod(0o600)
        system = Path(ssl.get_default_verify_paths().openssl_cafile or "")
        roots = Path("/etc/ssl/certs/ca-certificates.crt")
        system_roots = roots.read_bytes() if roots.is_file() else system.read_bytes() if system.is_file() else b""
        self.bundle = folder / "bundle.pem"
        self.bundle.write_bytes(system_roots + self.ca.read_bytes())
        self.system_roots = folder / "system.pem"  # the system's roots alone: this CA not trusted
        self.system_roots.write_bytes(system_roots)


class Index:
    """The test's package index; ``hold`` makes requests for one project wait until ``release``;
    ``tls``: served over HTTPS with that certificate (and key) file."""

    def __init__(self, root: Path, tls: Path | None = None) -> None:
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
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/simple/"
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
    served = Index(_demo_projects(root))
    served.uv_cache = tmp_path_factory.mktemp("uv-cache")  # the built-in machine's uv: a cache of this run's own
    yield served
    served.stop()


@pytest.fixture(scope="module")
def private_ca(tmp_path_factory: pytest.TempPathFactory) -> PrivateCA:
    return PrivateCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def tls_index(tmp_path_factory: pytest.TempPathFactory, private_ca: PrivateCA) -> Iterator[Index]:
    """The demo projects over HTTPS on 127.0.0.1, with a certificate from ``private_ca``."""
    served = Index(_demo_projects(tmp_path_factory.mktemp("tls-index")), tls=private_ca.server)
    yield served
    served.stop()


def _demo_projects(root: Path) -> Path:
    """The demo projects' wheels and simple pages in ``root``."""
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
    # pip, as every public index has it: env.sh puts it in each environment (MLflow pins it in a model's files).
    bundled = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    if bundled:
        shutil.copy(bundled[-1], files / bundled[-1].name)
    else:  # a distribution's Python without ensurepip's wheels: this one's own pip, written back
        installed_wheel(importlib.metadata.distribution("pip"), files)
    projects = ("rcdemo-a", "rcdemo-b", "rcdemo-c", "rcdemo-slow", "rcdemo-native", "rcdemo-top", "rcdemo-dep", "pip")
    for project in projects:
        (root / "simple" / project).mkdir(parents=True)
        links = "".join(
            f'<a href="../../files/{w.name}"{core_metadata(w)}>{w.name}</a>\n'
            for w in sorted(files.glob(project.replace("-", "_") + "-*.whl"))
        )
        (root / "simple" / project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return root


def installed_wheel(
    dist: importlib.metadata.Distribution, folder: Path, compression: int = zipfile.ZIP_DEFLATED
) -> None:
    """A wheel of an installed distribution, written back from its RECORD: the files it installed into
    site-packages (not its scripts), with the tag its WHEEL file names for this Python."""
    wheel_text = dist.read_text("WHEEL") or ""
    tags = [t.split(":", 1)[1].strip() for t in wheel_text.splitlines() if t.startswith("Tag:")]
    tag = next(t for t in tags if t.startswith(("py3", "cp3")))
    name, version = re.sub(r"[-_.]+", "_", dist.metadata["Name"]).lower(), dist.version
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{name}-{version}-{tag}.whl", "w", compression) as z:
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
