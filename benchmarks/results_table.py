"""Shared by the benchmarks: print a results table and save it with its data."""

import json
import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def save(name: str, table: str, data) -> str:
    """Prints `table`; writes results/<name>.md and results/<name>.json. Returns the folder."""
    print(table)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=2)
    with open(os.path.join(RESULTS, f"{name}.md"), "w") as f:
        f.write(table + "\n")
    return RESULTS
