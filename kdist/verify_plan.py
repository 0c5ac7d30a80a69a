"""What `kdist verify` asks of this process (`kdist.wiring.verify` acts on it): the plan its
command wrote into the folder named by ``KDIST_VERIFY``, read once per process.

The one-device run answers `kdist.global_batch_size` and `kdist.scale_learning_rate` with the
distributed run's replicas (`replicas`): its one device stands for those replicas with the global
batch, so a learning rate scaled for them must be the same in both runs.

>>> Plan.of_environment() is None          # not run by kdist verify
True
"""

from __future__ import annotations

import dataclasses
import json
import os

from kdist import envvars, global_state
from kdist.validators import UsageError

FILE, REPORT = "plan.json", "report.json"  # the plan; what the one-device run found


@dataclasses.dataclass(frozen=True)
class Plan:
    """The phase (``"record"``: distributed, or ``"replay"``: one device), the steps to record,
    the replicas of the distributed run (known when replaying), the folder the runs share."""

    folder: str
    phase: str
    steps: int
    replicas: int | None = None

    def write(self) -> None:
        with open(os.path.join(self.folder, FILE), "w") as f:
            json.dump(dataclasses.asdict(self), f)

    @staticmethod
    def of_environment() -> "Plan | None":
        """This process's plan, or None: not run by `kdist verify`, or its first fit is done."""
        folder = os.environ.get(envvars.VERIFY)
        if not folder or global_state.process().verified:
            return None
        try:
            with open(os.path.join(folder, FILE)) as f:
                return Plan(**json.load(f))
        except (OSError, ValueError, TypeError) as error:
            raise UsageError(envvars.VERIFY, f"{folder!r} holds no readable {FILE} ({error})",
                             "run the program through `kdist verify -- python train.py`, or "
                             f"unset {envvars.VERIFY}") from None


def mark_done() -> None:
    """This process's first fit is recorded or replayed: later ones train as usual."""
    global_state.process().verified = True


def replayed_replicas() -> int | None:
    """The distributed run's replicas while a one-device run replays it, else None."""
    plan = Plan.of_environment()
    return plan.replicas if plan is not None and plan.phase == "replay" else None
