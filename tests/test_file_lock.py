"""SharedFileLock: one lock file for processes, a queue on a thread lock for the threads of one process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import filelock
import pytest
from waiting import wait_for

from jupyter_remote_compute.fsutil import SharedFileLock


def _stack_of(thread: threading.Thread) -> list[str]:
    frame = sys._current_frames().get(thread.ident or -1)
    names = []
    while frame is not None:
        names.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
        frame = frame.f_back
    return names


def test_a_thread_waits_for_another_thread_on_the_thread_lock_not_by_polling_the_file(tmp_path: Path) -> None:
    """filelock polls every 50 ms even between threads of one process; a waiting thread here sleeps on the
    RLock until it is let go, and never touches the file meanwhile."""
    path = tmp_path / "state.lock"
    holder, waiter = SharedFileLock(path, timeout=30), SharedFileLock(path, timeout=30)
    got = threading.Event()

    def wait_for_lock() -> None:
        with waiter:
            got.set()

    holder.acquire()
    thread = threading.Thread(target=wait_for_lock, daemon=True)
    thread.start()
    stack = wait_for(
        lambda: (s := _stack_of(thread)) and any(n.endswith("fsutil.py:acquire") for n in s) and s,
        10,
        "the second thread to wait for the lock",
    )
    assert not any("filelock" in name for name in stack), stack
    assert not got.is_set()
    holder.release()
    assert got.wait(10)
    thread.join(10)


def test_threads_and_processes_exclude_each_other(tmp_path: Path) -> None:
    """Two processes of two threads each add to one counter file, each under the lock: no addition is lost."""
    path, counter = tmp_path / "count.lock", tmp_path / "count"
    counter.write_text("0")
    adder = textwrap.dedent(
        f"""
        import threading
        from pathlib import Path
        from jupyter_remote_compute.fsutil import SharedFileLock
        counter = Path({str(counter)!r})

        def add():
            lock = SharedFileLock({str(path)!r}, timeout=60)
            for _ in range(100):
                with lock:
                    counter.write_text(str(int(counter.read_text()) + 1))

        threads = [threading.Thread(target=add) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", adder]) for _ in range(2)]
    assert [p.wait(120) for p in procs] == [0, 0]
    assert counter.read_text() == "400"


def test_a_lock_held_by_another_process_times_out_and_leaves_the_thread_lock_free(tmp_path: Path) -> None:
    path = tmp_path / "held.lock"
    other = filelock.FileLock(str(path))  # another holder of the file: a different open file description
    other.acquire()
    try:
        with pytest.raises(filelock.Timeout):
            SharedFileLock(path, timeout=0.2).acquire()
    finally:
        other.release()
    # Had the timeout kept this process's thread lock, a thread other than this one would now wait for ever.
    done = threading.Event()

    def take() -> None:
        with SharedFileLock(path, timeout=5):
            done.set()

    threading.Thread(target=take, daemon=True).start()
    assert done.wait(10)


def test_a_thread_holding_the_lock_makes_another_thread_time_out_not_hang(tmp_path: Path) -> None:
    path = tmp_path / "busy.lock"
    errors: list[BaseException] = []
    with SharedFileLock(path, timeout=30):

        def take() -> None:
            try:
                SharedFileLock(path, timeout=0.2).acquire()
            except BaseException as e:  # the test reads what was raised
                errors.append(e)

        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        thread.join(10)
        assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], filelock.Timeout)


def test_the_lock_is_reentrant_within_a_thread(tmp_path: Path) -> None:
    lock = SharedFileLock(tmp_path / "again.lock", timeout=1)
    with lock, lock:
        pass
    with SharedFileLock(tmp_path / "again.lock", timeout=1):  # and free once both were let go
        pass
