"""A stand-in task for launcher tests: `task.py PID_DIR RULE...` with RULE = `TASK=ACTION`.

TASK is e.g. `worker:1` or `*`, optionally with `@R` to apply on restart R only (`worker:1@0`,
from KDIST_RESTART_COUNT); ACTION is `exitN` (exit with code N), `exitN@S` (the same after S
seconds), `sleep` (serve forever, like a ps), `print` (print TF_CONFIG and exit 0), `waitN` (sleep N
seconds, exit 0), `raise` (import kdist, then end on an uncaught ValueError), `hang` (import
kdist, then block forever in `waiting_for_a_peer_that_never_answers`), `kill9` (SIGKILL
itself, as the out-of-memory killer would) or `chatter` (print TensorFlow's C++ start-up lines and
a Keras progress bar, as a training task does, and exit 0). Writes its pid to PID_DIR/<task>.pid first; an exit or wait starts only once
every task of the cluster has written its pid (so a test never races a task that has not
started yet on a busy machine).
"""

import json
import os
import sys
import time

config = json.loads(os.environ["TF_CONFIG"])
task = f"{config['task']['type']}:{config['task']['index']}"
pid_dir, rules = sys.argv[1], dict(rule.split("=", 1) for rule in sys.argv[2:])
# Written whole, then renamed: a test that sees <task>.pid never reads it half-written (a
# launcher killed between the open and the write would otherwise leave an empty file).
partial = os.path.join(pid_dir, f"{task}.pid.partial")
with open(partial, "w") as f:
    f.write(str(os.getpid()))
os.replace(partial, os.path.join(pid_dir, f"{task}.pid"))
restart = os.environ.get("KDIST_RESTART_COUNT", "unset")


def wait_for_every_task(seconds=60):
    expected = sum(len(addresses) for addresses in config["cluster"].values())
    deadline = time.monotonic() + seconds
    while len([n for n in os.listdir(pid_dir) if n.endswith(".pid")]) < expected:
        if time.monotonic() > deadline:
            sys.exit(f"task.py: not every task started within {seconds} s")
        time.sleep(0.05)


action = rules.get(f"{task}@{restart}", rules.get(task, rules.get("*", "print")))
print(f"task {task} does {action} on restart {restart}, world size change "
      f"{os.environ.get('KDIST_WORLD_SIZE_CHANGE', 'none')}")
if action == "print":
    print(json.dumps(config))
elif action.startswith("exit"):
    wait_for_every_task()
    code, _, delay = action[4:].partition("@")
    time.sleep(float(delay or 0))
    sys.exit(int(code))
elif action.startswith("wait"):
    wait_for_every_task()
    time.sleep(float(action[4:]))
elif action == "sleep":
    while True:
        time.sleep(1)
elif action == "raise":
    import kdist  # noqa: F401  (its failure record)

    wait_for_every_task()
    raise ValueError("bad shape (3, 4) for the kernel")
elif action == "hang":
    import kdist  # noqa: F401,F811  (its stacks on the launcher's request)

    def waiting_for_a_peer_that_never_answers():
        while True:
            time.sleep(1)

    waiting_for_a_peer_that_never_answers()
elif action == "kill9":
    import signal

    wait_for_every_task()
    os.kill(os.getpid(), signal.SIGKILL)
elif action == "chatter":
    print("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR")
    print("I0000 00:00:1795515054.931264   26186 port.cc:153] oneDNN custom operations are on.")
    print("E0000 00:00:1795515054.931264   26186 cuda_platform.cc:52] failed call to cuInit: x")
    print("Epoch 1/1")
    bar = "\x1b[1m{0}/3\x1b[0m \x1b[32m" + "\u2501" * 4 + "\x1b[0m - loss: 0.{0}"
    sys.stdout.write("".join("\r" + bar.format(n) + "\b" * 3 for n in (1, 2, 3)) + "\n")
    print("done")
