"""Every exit code a `kdist` command or a kdist-run task can end with, in one place.

They follow the shell's conventions, so `kdist launch` composes with `timeout`, Kubernetes
`podFailurePolicy` rules and CI scripts:

>>> from kdist import exit_codes
>>> exit_codes.of_returncode(-9)      # a task killed by SIGKILL, as a shell reports it
137
"""

OK = 0
VERIFY_DIFFERS = 1  # kdist verify: the distributed run trained differently from one device
USAGE = 2  # a bad flag value, spec file or TF_CONFIG: the message names the field and the fix
PEERS_MISSING = 69  # EX_UNAVAILABLE: other tasks never started within the start-up deadline
PREEMPTED = 75  # EX_TEMPFAIL: a task saved its backup on SIGTERM; restarting it resumes
HUNG = 76  # no training step completed within the hang timeout (kdist.watchdog, when asked)
TIMED_OUT = 124  # as coreutils `timeout`
NOT_EXECUTABLE = 126  # the program to run exists but cannot be executed (as the shell)
NOT_FOUND = 127  # the program to run does not exist (as the shell)
SIGNAL_BASE = 128  # killed by (or stopped on) signal N -> 128 + N


def of_returncode(returncode: int) -> int:
    """A child's exit status as a shell reports it (killed by signal N -> 128 + N)."""
    return SIGNAL_BASE - returncode if returncode < 0 else returncode
