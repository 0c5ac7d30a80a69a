"""Fault tolerance: what lets a job lose a task and go on from where it was.

- `backup`: verified backups, one atomic, self-describing unit per save (`BackupError` when one
  cannot be restored as saved);
- `elastic`: resuming on another number of workers, the position kept in examples;
- `preemption`: every worker saving at the same step when one gets SIGTERM.

`kdist.callbacks.BackupAndRestore` puts them together for `fit`; `kdist launch --max-restarts`
restarts the tasks (`kdist.launch`).
"""
