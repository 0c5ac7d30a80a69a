"""A worker that starts TensorFlow's gRPC server (`kdist.strategy()`), writes its port to
FOLDER/<task>.port and waits (at most 120 s) for FOLDER/done, so a test can try to reach it."""

import json
import os
import sys
import time

import kdist

folder = sys.argv[1]
kdist.strategy()
tf_config = json.loads(os.environ["TF_CONFIG"])
task = tf_config["task"]
address = tf_config["cluster"][task["type"]][task["index"]]
name = os.path.join(folder, f"{task['type']}-{task['index']}.port")
with open(name + ".tmp", "w") as f:
    f.write(address.rsplit(":", 1)[1])
os.replace(name + ".tmp", name)
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(folder, "done")) and time.monotonic() < deadline:
    time.sleep(0.1)
