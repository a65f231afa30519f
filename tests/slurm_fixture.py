"""A real single-node Slurm cluster on this machine, started by the tests without systemd.

Debian's ``munge``, ``slurmctld`` and ``slurmd`` (scripts/setup.sh installs them) run in the
foreground as children of the test process, with every key, socket, state, spool and log file in
one temporary folder. The node is this machine as ``slurmd -C`` sees it (its real CPUs and memory).

A "login node" is a second loopback sshd (``sshd_fixture.start_sshd``) that accepts the ssh test
bed's user key and sets ``SLURM_CONF`` for its sessions, so ``sbatch``/``squeue`` typed by the
unprivileged test user reach this cluster as they would on a real login node, with no per-command
setup the engine would have to know about.

Two test runs on one machine do not collide: each bed has its own cluster name, node name, free
ports, munge key and socket, and temp folder. That is chosen over a file lock so a second
run never waits on the first; the price is two small clusters at once, each believing it owns all
CPUs (harmless: jobs here are short and mostly sleep).

The plain function ``start_slurm_bed`` is also used by ``benchmarks/bench_slurm.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from far_python import far_python_bin
from required import require
from slurm_nodes import HOST_ADDR, NodeNetwork
from sshd_fixture import SSHServer, TestBed, start_sshd, terminate
from waiting import wait_for

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
PARTITION = "debug"
#: Memory a job gets when it asks for none (MiB per CPU); without it a job would take the whole node.
DEF_MEM_PER_CPU = 256
#: How long squeue remembers a finished job (Slurm's default is 300 s; tests read terminal states).
MIN_JOB_AGE = 300
#: Seconds between TERM and KILL when Slurm ends a job: Slurm's default. What a job runs to stop cleanly must fit
#: in it, and container.sh gives a container 10 s of it, the rest to rootless podman's stop and removal, which
#: took over 5 s, then over 8 s, on a loaded two-core machine with 15 here (a cancelled job's container was left
#: behind). Only a job that ignores TERM waits it out.
KILL_WAIT = 30


def slurm_installed() -> bool:
    return all(os.path.exists(p) for p in (MUNGED, SLURMCTLD, SLURMD)) and shutil.which("sbatch") is not None


def _free_ports(count: int) -> list[int]:
    # Hold every socket until all are chosen, so the ports differ from one another.
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_hardware() -> str:
    """This machine as slurmd sees it: ``CPUs=2 Boards=1 ... RealMemory=24105`` (no NodeName, no UpTime)."""
    out = subprocess.run([SLURMD, "-C"], capture_output=True, text=True, check=True).stdout
    line = out.splitlines()[0]
    return " ".join(word for word in line.split() if not word.startswith(("NodeName=", "UpTime=")))


def _field(hardware: str, name: str) -> int:
    found = re.search(rf"\b{name}=(\d+)", hardware)
    if not found:
        raise RuntimeError(f"slurmd -C printed no {name}: {hardware!r}")
    return int(found.group(1))


@dataclasses.dataclass
class SlurmBed:
    """A running cluster, its login sshd and how to reach it as the test user."""

    workdir: Path
    conf: Path
    cluster: str
    node: str
    partition: str
    cpus: int
    memory_mb: int
    user: str
    user_home: Path
    user_key: Path
    login: SSHServer
    known_hosts: Path
    procs: dict[str, subprocess.Popen]  # type: ignore[type-arg]
    base_dir: str  # the test user's folder for this session's job folders, "~/..."
    nodes: list[str] = dataclasses.field(default_factory=list)  # every node's name, ``node`` first
    network: NodeNetwork | None = None  # the nodes' namespaces, on a bed of several

    @property
    def env(self) -> dict[str, str]:
        """What a local (root) client needs to talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def machine_options(self, **over: object) -> dict[str, object]:
        """Options of a ``slurm`` machine whose login node is this bed's (address 127.0.0.1)."""
        options: dict[str, object] = {
            "user": self.user,
            "port": self.login.port,
            "identity_file": str(self.user_key),
            "known_hosts": str(self.known_hosts),
            "ssh_config": "/dev/null",
            "base_dir": self.base_dir,
        }
        options.update(over)
        return options

    def log(self, name: str) -> str:
        path = self.workdir / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def ssh_argv(self, command: str) -> list[str]:
        """``ssh`` to the login node as the test user, running ``command`` in its login shell."""
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.user_key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-p",
            str(self.login.port),
            f"{self.user}@127.0.0.1",
            command,
        ]

    def ssh(self, command: str, stdin: bytes = b"", check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a shell command on the login node as the test user; text output."""
        done = subprocess.run(self.ssh_argv(command), input=stdin.decode(), capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"ssh {command!r} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def run(self, argv: Sequence[str], stdin: bytes = b"", check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run one argv on the login node (quoted for its shell)."""
        return self.ssh(shlex.join(argv), stdin, check)

    def far_path(self, relative: str) -> Path:
        return self.user_home / relative.removeprefix("~/")

    def node_state(self) -> str:
        done = subprocess.run(
            ["sinfo", "--noheader", "--nodes", ",".join(self.nodes), "--format=%T"],
            capture_output=True,
            text=True,
            env=self.env,
        )
        return done.stdout.strip()

    def cancel_all(self) -> None:
        """Cancel every job of this cluster and wait until none is left running (so no slurmstepd outlives us)."""
        subprocess.run(["scancel", "--full", "--partition", self.partition], env=self.env, capture_output=True)

        def quiet() -> bool:
            done = subprocess.run(
                ["squeue", "--noheader", "--states=PENDING,RUNNING,COMPLETING,CONFIGURING,SUSPENDED", "--format=%i"],
                capture_output=True,
                text=True,
                env=self.env,
            )
            return done.returncode == 0 and not done.stdout.strip()

        wait_for(quiet, 60, "every Slurm job to end")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.cancel_all()
        with contextlib.suppress(Exception):
            self.login.stop()
        for name in (*(n for n in self.procs if n.startswith("slurmd")), "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is not None:
                with contextlib.suppress(Exception):
                    terminate(proc)
        if self.network is not None:
            self.network.remove()
        shutil.rmtree(self.far_path(self.base_dir), ignore_errors=True)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _write_conf(
    bed_dir: Path,
    cluster: str,
    nodes: Sequence[tuple[str, str, str]],
    hardware: str,
    ports: list[int],
    munge_socket: Path,
    controller: str = "127.0.0.1",
) -> Path:
    """slurm.conf of a cluster whose controller is this host at ``controller``, with ``nodes`` as
    (name, NodeAddr, NodeHostname); several nodes keep their slurmd's files apart by name (``%n``)."""
    host = socket.gethostname()
    conf = bed_dir / "slurm.conf"
    each = "" if len(nodes) == 1 else ".%n"
    node_lines = "\n".join(
        f"NodeName={name} NodeAddr={addr} NodeHostname={hostname} {hardware} State=UNKNOWN"
        for name, addr, hostname in nodes
    )
    names = ",".join(name for name, _, _ in nodes)
    conf.write_text(
        f"""# A test cluster written by tests/slurm_fixture.py
ClusterName={cluster}
SlurmctldHost={host}({controller})
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={bed_dir / "state"}
SlurmdSpoolDir={bed_dir / "spool"}{each.replace(".", "/")}
SlurmctldPidFile={bed_dir / "slurmctld.pid"}
SlurmdPidFile={bed_dir / "slurmd"}{each}.pid
SlurmctldLogFile={bed_dir / "log" / "slurmctld.log"}
SlurmdLogFile={bed_dir / "log" / "slurmd"}{each}.log
# No cgroups here: track processes by parentage, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# Memory is a consumable resource, so --mem is a per-job limit; jobacct_gather/linux samples every
# second and OverMemoryKill ends a job over it (task/none cannot enforce a limit by itself).
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU={DEF_MEM_PER_CPU}
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# Slurm waits up to 3 s (batch_sched_delay) to schedule a batch job after its submission, for
# clusters swamped with submissions; here that would only slow the tests: a job starts within ~1 s.
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MinJobAge={MIN_JOB_AGE}
KillWait={KILL_WAIT}
SlurmctldTimeout=30
SlurmdTimeout=30
{node_lines}
PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""
    )
    conf.chmod(0o644)
    return conf


def _start_munged(bed_dir: Path) -> tuple[subprocess.Popen, Path]:  # type: ignore[type-arg]
    """munged as the munge user with a fresh key of this bed's own; returns it and its socket."""
    munge = pwd.getpwnam("munge")
    private = bed_dir / "munge"
    run = bed_dir / "munge-run"  # the socket's folder: every user must reach it
    for path, mode in ((private, 0o700), (run, 0o755)):
        path.mkdir(mode=mode)
        os.chown(path, munge.pw_uid, munge.pw_gid)
    key = private / "munge.key"
    key.write_bytes(os.urandom(128))
    os.chown(key, munge.pw_uid, munge.pw_gid)
    key.chmod(0o400)
    sock = run / "munge.socket"
    log = bed_dir / "log" / "munged.log"
    log.touch()
    os.chown(log, munge.pw_uid, munge.pw_gid)
    argv = [
        MUNGED,
        "--foreground",
        f"--socket={sock}",
        f"--key-file={key}",
        f"--pid-file={private / 'munged.pid'}",
        f"--seed-file={private / 'munged.seed'}",
        f"--log-file={log}",
        # /tmp is world-writable (with the sticky bit); munged's path checks would refuse it otherwise.
        "--force",
    ]
    proc = subprocess.Popen(
        argv,
        user=munge.pw_uid,
        group=munge.pw_gid,
        extra_groups=[],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"munged exited with {proc.returncode}: {log.read_text(errors='replace')}")
        return sock.exists()

    wait_for(ready, 20, "munged's socket")
    return proc, sock


def start_slurm_bed(ssh: TestBed, node_count: int = 1) -> SlurmBed:
    """Start munged, slurmctld, slurmd and a login sshd for ``ssh``'s user; wait until the node is idle.

    With ``node_count`` > 1 each node is a network namespace of its own (``slurm_nodes.py``; hold its
    ``LOCK``), its slurmd inside it."""
    tag = uuid.uuid4().hex[:8]
    bed_dir = Path(tempfile.mkdtemp(prefix=f"jrc-slurm-{tag}-"))
    bed_dir.chmod(0o755)  # the test user reads slurm.conf and reaches munged's socket through here
    (bed_dir / "log").mkdir()
    for sub in ("state", "spool"):
        (bed_dir / sub).mkdir(mode=0o700)
    procs: dict[str, subprocess.Popen] = {}  # type: ignore[type-arg]
    hardware = node_hardware()
    cluster, node = f"jrc{tag}", f"jrcnode{tag}"
    login = None
    network = None
    try:
        procs["munged"], munge_socket = _start_munged(bed_dir)
        nodes, controller = [(node, "127.0.0.1", socket.gethostname())], "127.0.0.1"
        if node_count > 1:
            network = NodeNetwork.make(bed_dir, tag, node_count)
            nodes, controller, node = network.nodes, HOST_ADDR, network.nodes[0][0]
            # Each slurmd makes its own spool/<node> (0755): the job's user runs its script from there.
            (bed_dir / "spool").chmod(0o755)
        conf = _write_conf(bed_dir, cluster, nodes, hardware, _free_ports(2), munge_socket, controller)
        env = {**os.environ, "SLURM_CONF": str(conf)}
        # -D: stay in the foreground, so the processes we hold are the daemons; -i: ignore old state.
        # They also log to stderr in the foreground: their log files already hold it.
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        procs["slurmctld"] = subprocess.Popen([SLURMCTLD, "-D", "-i", "-f", str(conf)], env=env, **quiet)
        if network is None:
            procs["slurmd"] = subprocess.Popen([SLURMD, "-D", "-N", node, "-f", str(conf)], env=env, **quiet)
        for i, (name, _, _) in enumerate(network.nodes if network else [], start=1):
            argv = network.enter(i, [SLURMD, "-D", "-N", name, "-f", str(conf)])  # type: ignore[union-attr]
            procs[f"slurmd.{name}"] = subprocess.Popen(argv, env=env, **quiet)
        path = f"{far_python_bin()}:/usr/local/bin:/usr/bin:/bin"
        login = start_sshd(
            bed_dir, "slurm-login", ssh.workdir / "authorized_keys", f"SetEnv PATH={path} SLURM_CONF={conf}"
        )
        known_hosts = bed_dir / "known_hosts"
        known_hosts.write_text(login.known_hosts_line)
        bed = SlurmBed(
            workdir=bed_dir,
            conf=conf,
            cluster=cluster,
            node=node,
            partition=PARTITION,
            cpus=_field(hardware, "CPUs"),
            memory_mb=_field(hardware, "RealMemory"),
            user=ssh.user,
            user_home=ssh.home,
            user_key=ssh.user_key,
            login=login,
            known_hosts=known_hosts,
            procs=procs,
            base_dir=f"~/.jrc-slurm-{tag}",
            nodes=[name for name, _, _ in nodes],
            network=network,
        )

        def idle() -> bool:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}: {bed.log(name)[-2000:]}")
            return set(bed.node_state().split()) == {"idle"}

        wait_for(idle, 60, f"Slurm nodes {','.join(bed.nodes)} to be idle", interval=0.1)
        bed.far_path(bed.base_dir).mkdir(mode=0o755)
        owner = pwd.getpwnam(ssh.user)
        os.chown(bed.far_path(bed.base_dir), owner.pw_uid, owner.pw_gid)
        return bed
    except BaseException:
        if login is not None:
            login.stop()
        for proc in reversed(procs.values()):
            terminate(proc)
        if network is not None:
            network.remove()
        shutil.rmtree(bed_dir, ignore_errors=True)
        raise


# -- pytest fixture ----------------------------------------------------------


@pytest.fixture(scope="session")
def slurm_bed(sshd_bed: TestBed) -> Iterator[SlurmBed]:
    require(slurm_installed(), "Slurm (apt-get install slurmctld slurmd munge slurm-client)")
    require(os.geteuid() == 0, "root, to start munged and slurmd for the Slurm test bed")
    bed = start_slurm_bed(sshd_bed)
    try:
        yield bed
    finally:
        bed.stop()


@contextlib.contextmanager
def slurm_service(make_service: Callable[..., Any], workspace: Path, bed: SlurmBed, machine: str) -> Iterator[Any]:
    """The job service over ``workspace`` with ``bed`` as its slurm machine ``machine``; closed after,
    with every job of the bed cancelled."""
    service = make_service(workspace)
    service.machines.add(machine, "slurm", "127.0.0.1", bed.machine_options())
    try:
        yield service
    finally:
        service.close()
        bed.cancel_all()
