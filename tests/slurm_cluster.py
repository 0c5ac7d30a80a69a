"""A real Slurm cluster on this host for the tests: munged, slurmctld and two slurmd nodes (n1, n2)
sharing 127.0.0.1, each slurmd with its own node name and port (Debian's slurm-wlm 22.05 and
munge, from the package registry). Everything lives in one folder and stops with `stop()`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import portpicker

BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo", "scancel")
CONFIG = """\
ClusterName=kdist
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
MinJobAge=3600
SlurmdParameters=config_overrides
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
{nodes}
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""
NODE = "NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=2 State=UNKNOWN"


def missing() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


class SlurmCluster:
    """munged + slurmctld + slurmd n1, n2 on 127.0.0.1, configured in `folder`."""

    def __init__(self, folder: str):
        self.folder = folder
        self.config = os.path.join(folder, "slurm.conf")
        self.env = {**os.environ, "SLURM_CONF": self.config}
        self.env.pop("TF_CONFIG", None)
        self.daemons: list[subprocess.Popen] = []

    def start(self, timeout: float) -> "SlurmCluster":
        folder = self.folder
        for sub in ("state", "spool-n1", "spool-n2"):
            os.makedirs(os.path.join(folder, sub), exist_ok=True)
        key = os.path.join(folder, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        ports = [portpicker.pick_unused_port() for _ in range(3)]
        nodes = "\n".join(NODE.format(name=name, port=port)
                          for name, port in zip(("n1", "n2"), ports[1:]))
        with open(self.config, "w") as f:
            f.write(CONFIG.format(folder=folder, ctld_port=ports[0], nodes=nodes))
        self._daemon(["munged", "-F", "-f", f"--socket={folder}/munge.socket", f"--key-file={key}",
                      f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
                      f"--seed-file={folder}/munged.seed"])
        self._wait(lambda: os.path.exists(f"{folder}/munge.socket"), timeout, "munged")
        self._daemon(["slurmctld", "-D", "-i", "-f", self.config])
        for name in ("n1", "n2"):
            self._daemon(["slurmd", "-D", "-N", name, "-f", self.config])
        self._wait(lambda: self.run(["sinfo", "-h", "-o", "%t %D"]).stdout.split() == ["idle", "2"],
                   timeout, "two idle nodes")
        return self

    def _daemon(self, command: list[str]) -> None:
        log = open(os.path.join(self.folder, f"{os.path.basename(command[0])}-{len(self.daemons)}"
                                             ".out"), "w")
        self.daemons.append(subprocess.Popen(command, env=self.env, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True))

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm test cluster: no {what} within {timeout:.0f} s; logs in "
                                   f"{self.folder}")
            time.sleep(0.5)

    def run(self, command: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(command, env={**self.env, **kwargs.pop("env", {})},
                              capture_output=True, text=True, timeout=timeout, **kwargs)

    def job_state(self, job: str) -> str:
        shown = self.run(["scontrol", "show", "job", job, "-o"]).stdout
        for field in shown.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "UNKNOWN"

    def wait_for_job(self, job: str, timeout: float, states=("COMPLETED", "FAILED", "CANCELLED",
                                                             "TIMEOUT", "NODE_FAIL")) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job)
            if state in states:
                return state
            time.sleep(1)
        self.run(["scancel", job])
        raise TimeoutError(f"Slurm job {job} did not end within {timeout:.0f} s "
                           f"(state {self.job_state(job)})")

    def stop(self) -> None:
        self.run(["scancel", "--full", "--user", "root"])
        for daemon in reversed(self.daemons):
            try:
                os.killpg(daemon.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for daemon in self.daemons:
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
