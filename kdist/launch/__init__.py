"""The process side: start and supervise the tasks of a local cluster (`kdist launch`).

No TensorFlow import here: the launcher only starts processes.

>>> from kdist.launch import Launcher, State
>>> State.SUCCEEDED.value
'succeeded'
"""

from kdist.launch.backend import Task, TaskBackend
from kdist.launch.config import LaunchConfig, in_flags
from kdist.launch.launcher import Launcher, Outcome, ProgramError, State, check_program

__all__ = ["LaunchConfig", "Launcher", "Outcome", "ProgramError", "State", "Task", "TaskBackend",
           "check_program", "in_flags"]
