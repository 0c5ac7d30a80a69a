"""Copies the saved benchmark results into README.md.

    python benchmarks/readme.py            # rewrite the generated blocks
    python benchmarks/readme.py --check    # exit 1 if README.md differs from the saved results

README.md marks each generated block `<!-- results: NAME -->` ... `<!-- /results -->`. The text
between the markers becomes benchmarks/results/NAME.md followed by one provenance line from
NAME.json (date, commit, machine, versions, command). No figure is typed by hand.
"""

import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(os.path.dirname(HERE), "README.md")
RESULTS = os.path.join(HERE, "results")
BLOCK = re.compile(r"(<!-- results: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)


def block(name: str) -> str:
    """The README text for results/NAME: its table, then where the figures come from."""
    with open(os.path.join(RESULTS, f"{name}.md")) as f:
        table = f.read().strip()
    with open(os.path.join(RESULTS, f"{name}.json")) as f:
        source = json.load(f)["provenance"]
    machine, versions = source["machine"], source["versions"]
    return (f"{table}\n\n<sub>Saved in `benchmarks/results/{name}.json`: {source['date']}, commit "
            f"{source['commit'][:10]}, {machine['cores']} cores ({machine['cpu']}), TensorFlow "
            f"{versions['tensorflow']}, Keras {versions['keras']}; `{source['command']}`.</sub>\n")


def generated(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + block(m.group("name")) + m.group(4), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args()
    with open(README) as f:
        text = f.read()
    new = generated(text)
    if args.check:
        stale = [m.group("name") for m in BLOCK.finditer(text) if m.group("body") != block(m.group("name"))]
        if stale:
            print(f"README.md is stale for {', '.join(stale)}: run python benchmarks/readme.py",
                  file=sys.stderr)
        return 1 if stale else 0
    with open(README, "w") as f:
        f.write(new)
    print(f"README.md: {len(BLOCK.findall(text))} generated blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
