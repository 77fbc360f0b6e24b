"""A real one-node Slurm cluster under a temporary directory, for tests.

:class:`SlurmCluster` writes ``slurm.conf``, ``gres.conf``, ``cgroup.conf`` and
``slurmdbd.conf`` into its directory, makes two fake GPUs (character devices, major 195 like
``/dev/nvidiaN``), and starts, each as a child process it stops by pid:

* ``munged`` with its own key and socket (nothing touches ``/run/munge``),
* MariaDB on a private data directory, socket and loopback port (``accounting=True``),
* ``slurmdbd``, then the cluster, accounts, users and QoS through ``sacctmgr``,
* ``slurmctld`` and ``slurmd`` on loopback ports,
* ``slurmrestd`` with JWT auth on a loopback TCP port (``restd=True``), as a central
  Deployment would reach it.

None of these can be given port 0 and say which port it got (their ports are written into
``slurm.conf`` and ``slurmdbd.conf`` for the others to read): each port is picked just before its
daemon starts, and a daemon that exits because another process took it in between is started
again on another (`harness.processes.start_on_ports`).

Facts this relies on (Debian bookworm, Slurm 22.05.8): the machine's cgroups are v1 with
separate controller mounts, so ``proctrack/cgroup`` + ``task/cgroup`` run with
``CgroupPlugin=cgroup/v1`` (on a unified cgroup v2 machine the harness picks ``cgroup/v2``
with ``IgnoreSystemd=yes``, untested); with munge's socket in a non-default place slurmctld also needs
``AccountingStoragePass=<socket>`` to reach slurmdbd; QoS needs accounting.

Run as root (``slurmd`` must be). ``setup.sh`` next to this file installs the packages.
Every command is a fixed argument list with a timeout; nothing goes through a shell.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.processes import Ports, PortTaken, in_use, start_on_ports, terminate, wait_for_port

__all__ = ["HarnessError", "SlurmCluster", "missing_programs"]

SETUP_SCRIPT = Path(__file__).with_name("setup.sh")
PROGRAMS = ("munged", "slurmctld", "slurmd", "scontrol", "squeue", "sbatch", "sacctmgr", "slurmdbd",
            "slurmrestd", "mariadbd", "mariadb-install-db", "mariadb", "runuser")
_SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
NVIDIA_MAJOR = 195


class HarnessError(RuntimeError):
    """The cluster could not be started; the message carries the daemons' log tails."""


def which(program: str) -> str | None:
    found = shutil.which(program)
    if found:
        return found
    for directory in _SBIN:
        candidate = Path(directory, program)
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if which(p) is None]


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class Account:
    """An account in the accounting database, with the users and QoS it allows."""

    name: str
    users: Sequence[str]
    qos: Sequence[str] = ()


@dataclass
class SlurmCluster:
    """One node (``node``) with two fake GPUs; see the module docstring.

    ``gpu_minors`` are the fake devices' minor numbers in gres.conf order: GRES index ``i`` is
    the device with minor ``gpu_minors[i]``. Give them out of order to check that a consumer
    maps GRES indexes through the device files rather than assuming index == minor.
    """

    accounting: bool = True
    restd: bool = True
    cluster_name: str = "gputally-test"
    node: str = field(default_factory=lambda: f"gpunode{secrets.token_hex(3)}")
    """The node's Slurm name; unique per cluster, so two test runs on one machine never share
    cgroup paths (``/slurm_<node>/...``)."""
    cpus: int = 8
    gpu_minors: Sequence[int] = (0, 1)
    constrain_devices: bool = True
    """``ConstrainDevices``: a job's devices cgroup admits only its GPUs (as GPU clusters run)."""
    accounts: Sequence[Account] = (
        Account("physics", users=("root",), qos=("normal", "high")),
        Account("chemistry", users=("root", "nobody"), qos=("normal",)),
    )
    extra_qos: Sequence[str] = ("high",)
    start_timeout: float = 60.0

    root: Path = field(init=False)
    daemons: list[Daemon] = field(init=False, default_factory=list)
    ports: dict[str, int] = field(init=False, default_factory=dict)
    start_seconds: float = field(init=False, default=0.0)
    """How long :meth:`start` took (install time not included)."""

    def __post_init__(self) -> None:
        self.host = socket.gethostname().split(".")[0]  # slurmctld and slurmdbd must run on their named host
        self.root = Path(tempfile.mkdtemp(prefix="gputally-slurm-"))
        self.root.chmod(0o755)  # jobs run as nobody read slurm.conf and the munge socket here
        for sub in ("etc", "state", "spool", "log", "run", "dev", "db"):
            (self.root / sub).mkdir(mode=0o755)
        self._log_sizes: dict[Path, int] = {}
        """Each log's size when the last daemon started: what it wrote since is that start's."""
        self.shared = self.root / "shared"
        self.shared.mkdir()
        self.shared.chmod(0o1777)  # job pid files and output, written by any user

    # --- paths --------------------------------------------------------------------------

    @property
    def slurm_conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.root / "etc" / "gres.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "run" / "munge.socket"

    @property
    def restd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['restd']}"

    def gpu_file(self, minor: int) -> Path:
        return self.root / "dev" / f"nvidia{minor}"

    def env(self) -> dict[str, str]:
        """The environment Slurm commands need to find this cluster."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        missing = missing_programs()
        if missing:
            raise HarnessError(f"missing programs {missing}: run {SETUP_SCRIPT} as root")
        if os.geteuid() != 0:
            raise HarnessError("the Slurm harness must run as root (slurmd needs it)")
        started = time.monotonic()
        try:
            self._make_gpus()
            self._start_munge()
            self.jwt_key = self.root / "etc" / "jwt.key"
            self.jwt_key.write_bytes(secrets.token_bytes(32))
            self.jwt_key.chmod(0o600)
            if self.accounting:
                self._prepare_mariadb()
                self._on_ports(("mysql",), self._start_mariadb)
                self._on_ports(("dbd",), self._start_slurmdbd)
                self._create_accounts()
            self._on_ports(("ctld", "slurmd"), self._start_slurm)
            if self.restd:
                self._on_ports(("restd",), self._start_restd)
        except BaseException as exc:
            report = self.log_tails()
            self.stop()
            if isinstance(exc, HarnessError):
                raise HarnessError(f"{exc}\n{report}") from exc
            raise HarnessError(f"slurm cluster failed to start: {exc!r}\n{report}") from exc
        self.start_seconds = time.monotonic() - started

    def stop(self) -> None:
        """Cancel every job, then stop the daemons in reverse order, by pid. Safe twice."""
        if any(d.name == "slurmctld" and d.process.poll() is None for d in self.daemons):
            self.run(["scancel", "--full", "--user=root"], check=False)
            self.run(["scancel", "--full", "--user=nobody"], check=False)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                out = self.run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip()
                if not out:
                    break
                time.sleep(0.2)
        for daemon in reversed(self.daemons):
            terminate(daemon.process, 5.0)
        self.daemons.clear()

    def close(self) -> None:
        """Stop, then remove the directory and the (empty) cgroups slurmd left behind."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
        deadline = time.monotonic() + 5  # slurmstepd may still be tearing its last steps down
        while (left := list(Path("/sys/fs/cgroup").glob(f"*/slurm_{self.node}"))) and time.monotonic() < deadline:
            for top in left:
                for directory, _, _ in sorted(os.walk(top), key=lambda item: -len(item[0])):
                    with contextlib.suppress(OSError):
                        os.rmdir(directory)
            time.sleep(0.1)

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- using it -----------------------------------------------------------------------

    def run(
        self, argv: Sequence[str], *, user: str | None = None, check: bool = True, timeout: float = 30,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command against this cluster (as ``user`` through ``runuser``)."""
        full = [which(argv[0]) or argv[0], *argv[1:]]
        if user is not None and user != "root":
            full = [which("runuser") or "runuser", "-u", user, "--", *full]
        result = subprocess.run(
            full, env={**self.env(), **(env or {})}, capture_output=True, text=True, timeout=timeout, check=False,
            stdin=subprocess.DEVNULL,
        )
        if check and result.returncode != 0:
            raise HarnessError(f"{' '.join(full)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def sbatch(self, script: str, *args: str, user: str | None = None) -> int:
        """Submit ``script`` (a shell script body) and return the job ID."""
        path = self.shared / f"job-{secrets.token_hex(4)}.sh"
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
        out = self.run(
            ["sbatch", "--parsable", f"--output={self.shared}/slurm-%j.out", f"--chdir={self.shared}", *args,
             str(path)],
            user=user,
        ).stdout.strip()
        return int(out.split(";")[0])

    def wait_for_file(self, path: Path, *, timeout: float = 30) -> str:
        """The content of ``path`` once a job has written it (a pid, usually)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                text = path.read_text().strip()
            except FileNotFoundError:
                text = ""
            if text:
                return text
            time.sleep(0.05)
        raise HarnessError(f"{path} was not written within {timeout} s\n{self.log_tails()}")

    def wait_job_state(self, job_id: int, states: Sequence[str], *, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            out = self.run(["scontrol", "show", "job", "--oneliner", str(job_id)], check=False).stdout
            match = re.search(r"JobState=(\S+)", out)
            state = match.group(1) if match else ""
            if state in states:
                return state
            time.sleep(0.1)
        raise HarnessError(f"job {job_id} stayed {state or 'unknown'}, not {list(states)}")

    def pid(self, name: str) -> int:
        """The pid of daemon ``name`` (``slurmctld``, ``slurmrestd``...)."""
        return next(d.process.pid for d in self.daemons if d.name == name)

    @contextlib.contextmanager
    def paused(self, name: str) -> Iterator[None]:
        """Daemon ``name`` stopped with SIGSTOP (unreachable but alive), continued on exit."""
        pid = self.pid(name)
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    def token(self, user: str = "root", lifespan: int = 3600) -> str:
        """A JWT for slurmrestd, made by ``scontrol token``."""
        out = self.run(["scontrol", "token", f"username={user}", f"lifespan={lifespan}"]).stdout.strip()
        return out.split("=", 1)[1]

    def log_tails(self, lines: int = 15) -> str:
        parts = []
        for log in sorted((self.root / "log").glob("*")):
            try:
                tail = log.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            parts.append(f"--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(parts)

    # --- the pieces ---------------------------------------------------------------------

    def _start(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> None:
        log = self.root / "log" / f"{name}.out"
        self._log_sizes = {path: path.stat().st_size for path in (self.root / "log").glob("*")}
        with log.open("ab") as out:
            process = subprocess.Popen(
                list(argv), env={**self.env(), **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.daemons.append(Daemon(name, process, log))

    def _on_ports(self, names: Sequence[str], start: object) -> None:
        """``start()`` with ``self.ports[name]`` picked for each of ``names``, again on other
        ports while a daemon it starts exits because one was taken (`_wait` says so)."""
        assert callable(start)

        def attempt(ports: Ports) -> None:
            self.ports.update({name: ports[name] for name in names})
            first = len(self.daemons)
            try:
                start()
            except PortTaken:  # every daemon this start began goes, to start again together
                for daemon in reversed(self.daemons[first:]):
                    terminate(daemon.process, 5.0)
                del self.daemons[first:]
                raise

        start_on_ports(attempt, what=f"slurm's {', '.join(names)} port")

    def _wait(self, ready: object, what: str) -> None:
        """Until ``ready()``. A daemon that exits meanwhile is an error, `PortTaken` when its
        log says an address was in use (`_on_ports` starts it again)."""
        assert callable(ready)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            for daemon in self.daemons:
                if daemon.process.poll() is not None:
                    code = daemon.process.returncode
                    taken = self._in_use()
                    if taken is not None:
                        raise PortTaken(f"{daemon.name} exited with {code}: {taken}")
                    raise HarnessError(f"{daemon.name} exited with {code} while waiting for {what}")
            # A command that hangs (it reached another process on the port) is not ready yet:
            # the daemon's exit, seen next time round, says why.
            with contextlib.suppress(subprocess.TimeoutExpired):
                if ready():
                    return
            time.sleep(0.1)
        raise HarnessError(f"timed out after {self.start_timeout} s waiting for {what}")

    def _in_use(self) -> str | None:
        """A line of a daemon's log, written since the last start, saying its address was in use."""
        for path in sorted((self.root / "log").glob("*")):
            found = in_use(path, self._log_sizes.get(path, 0))
            if found is not None:
                return f"{path.name}: {found}"
        return None

    def _make_gpus(self) -> None:
        for minor in self.gpu_minors:
            os.mknod(self.gpu_file(minor), 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))

    def _start_munge(self) -> None:
        key = self.root / "etc" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        self._start("munged", [
            which("munged") or "munged", "--foreground", "--force", f"--socket={self.munge_socket}",
            f"--key-file={key}", f"--pid-file={self.root / 'run' / 'munged.pid'}",
            f"--log-file={self.root / 'log' / 'munged.log'}", f"--seed-file={self.root / 'run' / 'munged.seed'}",
        ])
        self._wait(self.munge_socket.exists, "munged's socket")

    def _prepare_mariadb(self) -> None:
        datadir = self.root / "db"
        self._db_socket = self.root / "run" / "mysqld.sock"
        self._db_password = secrets.token_hex(8)
        result = subprocess.run(
            [which("mariadb-install-db") or "mariadb-install-db", "--no-defaults", f"--datadir={datadir}",
             "--user=root", "--auth-root-authentication-method=socket", "--skip-test-db"],
            capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise HarnessError(f"mariadb-install-db failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")

    def _start_mariadb(self) -> None:
        datadir = self.root / "db"
        self._start("mariadbd", [
            which("mariadbd") or "mariadbd", "--no-defaults", f"--datadir={datadir}", "--user=root",
            f"--socket={self._db_socket}", f"--port={self.ports['mysql']}", "--bind-address=127.0.0.1",
            f"--pid-file={self.root / 'run' / 'mysqld.pid'}", "--skip-log-bin", "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=16M", "--innodb-lock-wait-timeout=900", "--skip-name-resolve",
        ])
        self._wait(self._db_socket.exists, "MariaDB's socket")
        self._sql(
            f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{self._db_password}';"
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
        )

    def _sql(self, statements: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            result = subprocess.run(
                [which("mariadb") or "mariadb", "--no-defaults", f"--socket={self._db_socket}", "-u", "root",
                 "-e", statements],
                capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL,
            )
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise HarnessError(f"mariadb: {result.stderr.strip()}")
            time.sleep(0.2)

    def _start_slurmdbd(self) -> None:
        self._write_slurmdbd_conf()
        self._write_slurm_conf()  # for sacctmgr: where slurmdbd is
        self._start("slurmdbd", [which("slurmdbd") or "slurmdbd", "-D"])
        self._wait(self._dbd_up, "slurmdbd to answer sacctmgr")

    def _start_slurm(self) -> None:
        self._write_slurm_conf()
        self._start("slurmctld", [which("slurmctld") or "slurmctld", "-D", "-i"])
        self._wait(self._ctld_up, "slurmctld to answer scontrol ping")
        self._start("slurmd", [which("slurmd") or "slurmd", "-D", "-N", self.node])
        self._wait(self._node_idle, f"node {self.node} to become idle")

    def _start_restd(self) -> None:
        self._start(
            "slurmrestd",
            [which("slurmrestd") or "slurmrestd", "-a", "rest_auth/jwt", "-u", "nobody",
             "-s", "openapi/v0.0.38", f"127.0.0.1:{self.ports['restd']}"],
            env={"SLURM_JWT": "daemon"},
        )
        daemon = self.daemons[-1]
        failure = wait_for_port(daemon.process, "127.0.0.1", self.ports["restd"], self.start_timeout,
                                log=daemon.log, since=self._log_sizes.get(daemon.log, 0))
        if failure is not None:
            raise HarnessError(f"slurmrestd {failure}")

    def _write_slurmdbd_conf(self) -> None:
        path = self.root / "etc" / "slurmdbd.conf"
        path.write_text(_lines({
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "DbdAddr": "127.0.0.1",
            "DbdHost": self.host,
            "DbdPort": self.ports["dbd"],
            "SlurmUser": "root",
            "DebugLevel": "info",
            "LogFile": self.root / "log" / "slurmdbd.log",
            "PidFile": self.root / "run" / "slurmdbd.pid",
            "StorageType": "accounting_storage/mysql",
            "StorageHost": "127.0.0.1",
            "StoragePort": self.ports["mysql"],
            "StorageUser": "slurm",
            "StoragePass": self._db_password,
            "StorageLoc": "slurm_acct_db",
        }))
        path.chmod(0o600)

    def _write_slurm_conf(self) -> None:
        gres = f"gpu:h200:{len(self.gpu_minors)}"
        settings: dict[str, object] = {
            "ClusterName": self.cluster_name,
            "SlurmctldHost": f"{self.host}(127.0.0.1)",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "CredType": "cred/munge",
            "AuthAltTypes": "auth/jwt",
            "AuthAltParameters": f"jwt_key={self.jwt_key}",
            "StateSaveLocation": self.root / "state",
            "SlurmdSpoolDir": self.root / "spool",
            "SlurmctldPidFile": self.root / "run" / "slurmctld.pid",
            "SlurmdPidFile": self.root / "run" / "slurmd.pid",
            "SlurmctldLogFile": self.root / "log" / "slurmctld.log",
            "SlurmdLogFile": self.root / "log" / "slurmd.log",
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
            "ProctrackType": "proctrack/cgroup",
            "TaskPlugin": "task/cgroup",
            "JobAcctGatherType": "jobacct_gather/none",
            "MpiDefault": "none",
            "ReturnToService": 2,
            "SchedulerType": "sched/backfill",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "SlurmdParameters": "config_overrides",
            "GresTypes": "gpu",
            "MinJobAge": 300,
            "KillWait": 2,
            "InactiveLimit": 0,
            "MailProg": "/bin/true",
        }
        if "ctld" in self.ports:  # not yet while slurmdbd starts (sacctmgr reads only accounting's)
            settings.update({"SlurmctldPort": self.ports["ctld"], "SlurmdPort": self.ports["slurmd"]})
        if self.accounting:
            settings.update({
                "AccountingStorageType": "accounting_storage/slurmdbd",
                "AccountingStorageHost": "127.0.0.1",
                "AccountingStoragePort": self.ports["dbd"],
                "AccountingStoragePass": self.munge_socket,
                "AccountingStorageEnforce": "associations,limits,qos",
                "AccountingStorageTRES": "gres/gpu",
            })
        self.slurm_conf.write_text(
            _lines(settings)
            + f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} Gres={gres} State=UNKNOWN\n"
            + "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
            + "PartitionName=debug Nodes=ALL MaxTime=INFINITE State=UP\n"
        )
        self.gres_conf.write_text(
            "AutoDetect=off\n"
            + "".join(f"NodeName={self.node} Name=gpu Type=h200 File={self.gpu_file(m)}\n" for m in self.gpu_minors)
        )
        (self.root / "etc" / "cgroup.conf").write_text(_lines({
            **_cgroup_plugin(),
            "ConstrainCores": "no",
            "ConstrainRAMSpace": "no",
            "ConstrainDevices": "yes" if self.constrain_devices else "no",
        }))

    def _create_accounts(self) -> None:
        sacctmgr = ["sacctmgr", "-i"]
        self.run([*sacctmgr, "add", "cluster", self.cluster_name])
        for qos in self.extra_qos:
            self.run([*sacctmgr, "add", "qos", qos])
        for account in self.accounts:
            self.run([*sacctmgr, "add", "account", account.name, f"cluster={self.cluster_name}"])
            for user in account.users:
                self.run([*sacctmgr, "add", "user", user, f"account={account.name}", f"cluster={self.cluster_name}"])
                if account.qos:
                    self.run([*sacctmgr, "modify", "user", user, "where", f"account={account.name}",
                              "set", f"qos={','.join(account.qos)}"])
        # a default account for every user, so jobs without --account are accepted
        self.run([*sacctmgr, "modify", "user", "root", "set", "defaultaccount=physics"])

    def _dbd_up(self) -> bool:
        return self.run(["sacctmgr", "-n", "list", "cluster"], check=False, timeout=10).returncode == 0

    def _ctld_up(self) -> bool:
        return "UP" in self.run(["scontrol", "ping"], check=False, timeout=10).stdout

    def _node_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-n", self.node, "-o", "%t"], check=False, timeout=10).stdout
        return out.strip().startswith("idle")



def _cgroup_plugin() -> dict[str, str]:
    """cgroup/v1 where the controllers are mounted separately (as on the machines this was
    written on; cgroup/v2 refuses that hybrid); cgroup/v2 without systemd on a unified
    hierarchy (untested here)."""
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return {"CgroupPlugin": "cgroup/v2", "IgnoreSystemd": "yes"}
    return {"CgroupPlugin": "cgroup/v1", "CgroupMountpoint": "/sys/fs/cgroup"}


def _lines(settings: Mapping[str, object]) -> str:
    return "".join(f"{key}={value}\n" for key, value in settings.items())
