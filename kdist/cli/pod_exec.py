"""`kdist exec`: in a pod rendered by kdist, set TF_CONFIG from what the Job gives the pod, then
run the command (`kdist.k8s.pod`)."""

from __future__ import annotations

import argparse

from kdist.cli import parsing

# Imported inside functions: the pod's start-up and the launcher, which `kdist --help` must not
# load.


def add(commands) -> None:
    exec_ = commands.add_parser("exec", help="in a pod rendered by kdist: set TF_CONFIG from what "
                                             "the Job or JobSet gives the pod, then run the command")
    exec_.set_defaults(run=run)
    exec_.add_argument("command", nargs=argparse.REMAINDER, help="-- program and its arguments")


def run(args) -> int:
    from kdist.k8s import pod
    from kdist.launch import check_program

    command = parsing.after_dashes(args.command)
    check_program(command)
    pod.exec_with_tf_config(command)  # does not return
    return 0
