import os
import sys

from kdist.cli import main

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:  # the reader went away (`kdist ... | head`): as other commands, quietly
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 141  # 128 + SIGPIPE
sys.exit(code)
