"""The Jupyter kind's far side: the standard-library program its kernel runs (never imported here).

The engine sends this source with every call (``engines/jupyter.py``, ``_far_expression``): the kernel
execs it in a namespace of its own and calls one function with JSON arguments; the answer is JSON
(or bytes), base64'd so IPython's pretty printer cannot reshape it. Paths are absolute, as
``prepare.sh`` reported them. The far-side scripts (``*.sh`` beside it) run through ``sh``.
"""

import base64
import hashlib
import json
import os
import subprocess
import sys


def _write(path, text, mode=0o644):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _env():
    # `python` in a command or script is the kernel's interpreter, as it is in a notebook there.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY_", "PYDEVD_")) and k != "MPLBACKEND"}
    bindir = os.path.dirname(sys.executable)
    if env.get("PATH", "").split(os.pathsep)[:1] != [bindir]:
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def _jobdir(d):
    # Every absolute job directory we are handed must look like one of ours.
    if not (os.path.isabs(d) and os.path.basename(os.path.dirname(d)) == "jobs"):
        raise ValueError("not a job directory: " + d)
    return d


def put(path, first, last, data):
    # Kernel transport, upload: append one chunk to <path>.jrc-part, rename it into place at the end.
    part = path + ".jrc-part"
    if first:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(part, "wb" if first else "ab") as f:
        f.write(data)
    if last:
        os.replace(part, path)
    return {}


def read(path, offset, limit):
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit)
    except FileNotFoundError:
        return b""


def launch(jobdir, command, stdin):
    _jobdir(jobdir)
    _write(os.path.join(jobdir, "command.sh"), command, 0o755)
    env = _env()
    try:
        proc = subprocess.run(
            ["sh", os.path.join(jobdir, "launch.sh"), jobdir],
            input=base64.b64decode(stdin),
            capture_output=True,
            timeout=60,
            env=env,
        )
    except Exception as e:
        return {"error": type(e).__name__}
    if proc.returncode != 0:
        return {"error": f"launcher exit {proc.returncode}: {proc.stderr.decode(errors='replace')[-500:]}"}
    return {"pid": int(proc.stdout.split()[-1])}


def sh(argv, stdin, out_path=None):
    # One far-side script (farside/*.sh): the answer, or its stdout written to out_path (a tar).
    env = _env()
    sink = open(out_path + ".part", "wb") if out_path else subprocess.PIPE  # noqa: SIM115 - closed below
    try:
        proc = subprocess.run(argv, input=base64.b64decode(stdin), stdout=sink, stderr=subprocess.PIPE, env=env)
    finally:
        if out_path:
            sink.close()
    size = None
    if out_path:
        os.replace(out_path + ".part", out_path)
        size = os.path.getsize(out_path)
    out = "" if out_path else base64.b64encode(proc.stdout).decode()
    return {"code": proc.returncode, "out": out, "err": proc.stderr.decode(errors="replace")[-2000:], "size": size}


def pack(argv, out_path):
    # manifest.sh into out_path; its first entry (the output list) comes back with the answer
    answer = sh(argv, "", out_path)
    if answer["code"] == 0:
        with open(out_path, "rb") as f:
            head = f.read(512)
            size = int(head[124:136].strip(b"\0 ") or b"0", 8)
            answer["head"] = base64.b64encode(f.read(size)).decode()
    return answer


def hash_files(jobdir, paths):
    # sha256 of files the engine downloads by themselves, computed while they travel
    _jobdir(jobdir)
    found = {}
    for rel in paths:
        digest = hashlib.sha256()
        with open(os.path.join(jobdir, rel), "rb", buffering=0) as f:
            while True:
                data = f.read(1 << 20)
                if not data:
                    break
                digest.update(data)
        found[rel] = digest.hexdigest()
    return found


def call(op, args, blob=None):
    value = globals()[op](*args) if blob is None else globals()[op](*args, base64.b64decode(blob))
    if isinstance(value, bytes):
        return "B" + base64.b64encode(value).decode()
    return "J" + base64.b64encode(json.dumps(value).encode()).decode()
