"""Where training steps go: the step clock (input wait, compute, communication), the hang
watchdog and the stragglers' summary at each epoch's end (`StepWatch`).

>>> from kdist.steps import StepClock
>>> StepClock().where()
'step 0: starting (building or tracing the step) for 0 s'
"""

from kdist.steps import clock
from kdist.steps.clock import StepClock, reading
from kdist.steps.callback import StepWatch

__all__ = ["StepClock", "StepWatch", "clock", "reading"]
