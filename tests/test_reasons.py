"""The line a failed job's reason is made of, picked from what real programs print when they fail.

Each log is made here by running the program that prints it (python, uv, pip), offline; the end to end
tests (test_failure_reasons.py) run the same failures as jobs on local and ssh.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from uv import find_uv_bin

from jupyter_remote_compute.jobs.reasons import REASON_MAX, explaining_line, failure_reason, plain, shorten


def output_of(*argv: str, cwd: Path | None = None) -> str:
    """What a failing program printed, stdout and stderr as a log has them."""
    proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode != 0, proc.stdout
    return proc.stdout


def python_failing(source: str, tmp_path: Path) -> str:
    (tmp_path / "fit.py").write_text(source)
    return output_of(sys.executable, "fit.py", cwd=tmp_path)


def test_a_traceback_gives_its_exception(tmp_path):
    log = python_failing("print('epoch 1')\ndef f():\n    return {}['lr']\nf()\n", tmp_path)
    assert explaining_line(log) == "KeyError: 'lr'"


def test_a_chained_traceback_gives_the_exception_raised_last(tmp_path):
    source = "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise RuntimeError('no step size') from e\n"
    log = python_failing(source, tmp_path)
    assert "ZeroDivisionError: division by zero" in log
    assert explaining_line(log) == "RuntimeError: no step size"


def test_an_exception_with_a_message_over_lines_gives_its_first_line(tmp_path):
    log = python_failing("raise ValueError('bad shape\\nexpected (3, 4)')\n", tmp_path)
    assert explaining_line(log) == "ValueError: bad shape"


def test_a_syntax_error_without_a_traceback_line_gives_the_error(tmp_path):
    log = python_failing("def broken(:\n    pass\n", tmp_path)
    assert "Traceback" not in log
    assert explaining_line(log) == "SyntaxError: invalid syntax"


def test_a_traceback_whose_start_was_cut_off_still_gives_its_exception(tmp_path):
    log = python_failing("import sys\nsys.setrecursionlimit(60)\ndef f(n):\n    return f(n + 1)\nf(0)\n", tmp_path)
    cut = log.split("\n", 3)[3]  # the "Traceback" line is gone, as past the tail read
    assert explaining_line(cut) == "RecursionError: maximum recursion depth exceeded"


def test_a_traceback_the_command_printed_and_went_on_from_is_not_why_it_failed(tmp_path):
    source = (
        "import traceback, sys\n"
        "try:\n    {}['lr']\nexcept KeyError:\n    traceback.print_exc()\n"
        "for epoch in range(5):\n    print('epoch', epoch)\n"
        "sys.exit('fatal: the loss is nan')\n"
    )
    log = python_failing(source, tmp_path)
    assert "KeyError: 'lr'" in log
    assert explaining_line(log) == "fatal: the loss is nan"


def in_env_sh(installer_output: str) -> str:
    """The installer's output as env.sh logs it (engines/farside/env.sh): its lines before and after."""
    return (
        "environment 23ca9d0e1f2a: building with uv 0.9.5\n"
        + installer_output
        + "environment 23ca9d0e1f2a: could not be built; the installer's message is above\n"
    )


NOT_BUILT = "environment 23ca9d0e1f2a: could not be built: "


def _uv(tmp_path: Path) -> str:
    uv = find_uv_bin()
    subprocess.run([uv, "venv", "-q", str(tmp_path / "env")], check=True)
    (tmp_path / "none").mkdir(exist_ok=True)
    return uv


def _uv_fails(tmp_path: Path, *more: str) -> str:
    uv = _uv(tmp_path)
    return output_of(
        uv, "pip", "install", *more, "--no-index", "--find-links", str(tmp_path / "none"), "rcbarpkg==9.9",
        "--python", str(tmp_path / "env/bin/python"),
    )  # fmt: skip


UV_NO_SOLUTION = (
    "No solution found when resolving dependencies: Because rcbarpkg was not found in the provided package "
    "locations and you require rcbarpkg==9.9, we can conclude that your requirements are unsatisfiable."
)


def test_an_environment_that_could_not_be_built_says_so_with_uv_s_error_and_its_cause(tmp_path):
    assert explaining_line(in_env_sh(_uv_fails(tmp_path))) == NOT_BUILT + UV_NO_SOLUTION


def test_uv_in_colour_gives_the_same_words(tmp_path):
    log = _uv_fails(tmp_path, "--color", "always")
    assert "\x1b[" in log
    assert explaining_line(in_env_sh(log)) == NOT_BUILT + UV_NO_SOLUTION


def test_uv_at_a_terminal_spinner_and_all_gives_the_same_words(tmp_path):
    """What a job run under a terminal (script(1), a pty) logs: a spinner redrawn with CR and erase-line,
    the cause wrapped to the terminal's width."""
    uv = _uv(tmp_path)
    argv = [uv, "pip", "install", "--no-index", "--find-links", str(tmp_path / "none"), "rcbarpkg==9.9",
            "--python", str(tmp_path / "env/bin/python")]  # fmt: skip
    controller, terminal = os.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    log = b""
    with contextlib.suppress(OSError):  # EIO once uv has ended and closed its side
        while chunk := os.read(controller, 4096):
            log += chunk
    os.close(controller)
    assert proc.wait(timeout=60) != 0
    assert b"\r\x1b[2K" in log
    assert explaining_line(in_env_sh(log.decode())) == NOT_BUILT + UV_NO_SOLUTION


def test_a_package_that_fails_to_build_gives_the_build_s_own_exception(tmp_path):
    # an in-tree build backend, so nothing is fetched: its build_wheel imports what is not there
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        '[project]\nname = "rcbroken"\nversion = "1.0"\n'
    )
    (pkg / "backend.py").write_text(
        "def get_requires_for_build_wheel(*a, **k):\n    return []\ndef build_wheel(*a, **k):\n    import rc_not_here\n"
    )
    uv = _uv(tmp_path)
    install = [uv, "pip", "install", "--no-index", str(pkg), "--python", str(tmp_path / "env/bin/python")]
    want = f"{NOT_BUILT}Failed to build `rcbroken @ {pkg.as_uri()}`: ModuleNotFoundError: No module named 'rc_not_here'"
    for columns in ("", "80"):  # uv wraps its words, the quoted traceback's too, to COLUMNS when set
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
        proc = subprocess.run(install, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.returncode != 0 and "[stderr]" in proc.stdout and "hint:" in proc.stdout  # quoted, then hints
        assert explaining_line(in_env_sh(proc.stdout)) == want, proc.stdout


def test_pip_s_first_error_says_why(tmp_path):
    (tmp_path / "none").mkdir()
    log = output_of(
        sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-index",
        "--find-links", str(tmp_path / "none"), "rcbarpkg==9.9",
    )  # fmt: skip
    assert "ERROR: No matching distribution found" in log
    assert explaining_line(in_env_sh(log)) == (
        NOT_BUILT + "Could not find a version that satisfies the requirement rcbarpkg==9.9 (from versions: none)"
    )


def test_outside_an_environment_s_build_an_error_line_above_is_not_the_reason():
    # a command's own output that happens to look like an installer's
    log = "error: cache miss for step 3, recomputing\n  cause: no cache\nepoch 1\nfatal: the loss is nan\n"
    assert explaining_line(log) == "fatal: the loss is nan"


def test_the_notebook_runner_s_summary_wins_over_the_kernel_s_coloured_traceback():
    log = (
        "\x1b[31m---------------------------------------------------------------------------\x1b[39m\n"
        "\x1b[31mZeroDivisionError\x1b[39m                         Traceback (most recent call last)\n"
        "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[3]\x1b[39m\x1b[32m, line 2\x1b[39m\n"
        "\x1b[31mZeroDivisionError\x1b[39m: division by zero\n"
        "run-notebook: broken.ipynb: cell 3 failed: ZeroDivisionError: division by zero\n"
    )
    assert explaining_line(log) == "run-notebook: broken.ipynb: cell 3 failed: ZeroDivisionError: division by zero"


def test_otherwise_the_last_line_without_its_terminal_codes():
    log = "step 1\n\x1b]0;a title\x07\x1b[2K\x1b[1;31mfatal:\x1b[0m disk quota exceeded\r\n\n  \n"
    assert explaining_line(log) == "fatal: disk quota exceeded"
    assert explaining_line("\n \n") is None


@pytest.mark.parametrize(
    "raw",
    [
        "\x1b[38;5;196mred\x1b[0m",
        "\x1b]8;;https://x.test\x1b\\red\x1b]8;;\x1b\\",
        "\x9b1mred",
        "\x1b(Bred\x1b>",
        "r\x00e\x7fd",
    ],
)
def test_plain_takes_out_every_kind_of_terminal_code(raw):
    assert plain(raw) == "red"


def test_a_long_reason_is_cut_at_a_space_never_inside_a_path():
    path = "/home/someone/projects/a-rather-long-project-name/data/" + "x" * 80 + "/points.csv"
    reason = "exit code 1: FileNotFoundError: " + "the file is not there " * 8 + path
    short = shorten(reason)
    assert len(short) <= REASON_MAX and short.endswith("…")
    assert path not in short and "/home" not in short  # the path is left out whole, not cut


def test_a_missing_file_the_workspace_has_is_named_with_how_to_send_it(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data/points.csv").write_text("x\n")
    (tmp_path / "fit.py").write_text("open('data/points.csv')\n")
    log = output_of(sys.executable, "../fit.py", cwd=tmp_path / "data")  # run where the file is not
    reason = failure_reason(1, _log(tmp_path, log), ["fit.py"], tmp_path)
    assert reason == (
        "exit code 1: FileNotFoundError: [Errno 2] No such file or directory: 'data/points.csv'; "
        "data/points.csv is in the workspace but was not sent: send it with the job (--send data/points.csv)"
    )
    # sent (by name, folder or pattern), or not in the workspace: no hint
    for sent in (["data/points.csv"], ["data"], ["data/*.csv"], ["./data/"]):
        assert "not sent" not in failure_reason(1, _log(tmp_path, log), sent, tmp_path)
    (tmp_path / "data/points.csv").unlink()
    assert "not sent" not in failure_reason(1, _log(tmp_path, log), ["fit.py"], tmp_path)


def _log(folder: Path, text: str) -> Path:
    path = folder / "log"
    path.write_text(text)
    return path


def test_no_log_and_an_empty_log_say_so(tmp_path):
    assert failure_reason(2, None, [], tmp_path) == "exit code 2: (no log)"
    assert failure_reason(2, _log(tmp_path, "\n\n"), [], tmp_path) == "exit code 2: (empty log)"


def test_a_container_that_never_started_gives_the_runtimes_error_not_its_pointer_to_it() -> None:
    """container.sh says the runtime's words are above: the reason is those words (its error, not the
    warnings rootless podman prints on every call)."""
    log = (
        'time="2026-12-04T03:35:30Z" level=warning msg="The cgroupv2 manager is set to systemd but there is no'
        ' systemd user session available"\n'
        "Error: setting up CDI devices: unresolvable CDI devices nvidia.com/gpu=3\n"
        "container: podman could not start image localhost/jrc-gpu-a6e6193a:1 (its words are above)\n"
    )
    assert explaining_line(log) == (
        "container: podman could not start image localhost/jrc-gpu-a6e6193a:1: "
        "Error: setting up CDI devices: unresolvable CDI devices nvidia.com/gpu=3"
    )
