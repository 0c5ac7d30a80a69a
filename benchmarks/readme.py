"""Copies the saved benchmark results into README.md and the pages of docs/.

    python benchmarks/readme.py            # rewrite the generated blocks
    python benchmarks/readme.py --check    # exit 1 if a page differs from the saved results

A page marks each generated block `<!-- results: NAME -->` ... `<!-- /results -->`. The text
between the markers becomes benchmarks/results/NAME.md followed by one provenance line from
NAME.json (date, commit, machine, versions, command). No figure is typed by hand. The block
`<!-- results-index -->` ... `<!-- /results-index -->` (docs/benchmarks.md) becomes the list of
every saved result: the page that shows it, when and how it was measured.
"""

import argparse
import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
BLOCK = re.compile(r"^(<!-- results: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results -->)",
                   re.S | re.M)
INDEX = re.compile(r"^(<!-- results-index -->\n)(?P<body>.*?)(<!-- /results-index -->)", re.S | re.M)


def pages() -> list[str]:
    """README.md and every page of docs/, the files that may quote results."""
    return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def block(name: str) -> str:
    """The page text for results/NAME: its table, then where the figures come from."""
    with open(os.path.join(RESULTS, f"{name}.md")) as f:
        table = f.read().strip()
    with open(os.path.join(RESULTS, f"{name}.json")) as f:
        source = json.load(f)["provenance"]
    machine, versions = source["machine"], source["versions"]
    return (f"{table}\n\n<sub>Saved in `benchmarks/results/{name}.json`: {source['date']}, commit "
            f"{source['commit'][:10]}, {machine['cores']} cores ({machine['cpu']}), TensorFlow "
            f"{versions['tensorflow']}, Keras {versions['keras']}; `{source['command']}`.</sub>\n")


def index() -> str:
    """One row per saved result: the page showing it, its date, commit and command."""
    shown = {}
    for page in pages():
        with open(page) as f:
            for name in re.findall(r"^<!-- results: ([\w-]+) -->$", f.read(), flags=re.M):
                shown.setdefault(name, os.path.relpath(page, os.path.join(ROOT, "docs")))
    rows = ["| result | shown in | measured | commit | command |", "|---|---|---|---|---|"]
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        name = os.path.basename(path)[:-5]
        with open(path) as f:
            source = json.load(f)["provenance"]
        page = shown.get(name)
        link = f"[{page}]({page})" if page and not page.startswith("..") else (page or "nowhere")
        rows.append(f"| `{name}` | {link} | {source['date']} | {source['commit'][:10]} | "
                    f"`{source['command']}` |")
    return "\n".join(rows) + "\n"


def generated(text: str) -> str:
    text = BLOCK.sub(lambda m: m.group(1) + block(m.group("name")) + m.group(4), text)
    return INDEX.sub(lambda m: m.group(1) + index() + m.group(3), text)


def stale(text: str) -> list[str]:
    found = [m.group("name") for m in BLOCK.finditer(text) if m.group("body") != block(m.group("name"))]
    return found + ["the results index" for m in INDEX.finditer(text) if m.group("body") != index()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args()
    outdated = 0
    for page in pages():
        with open(page) as f:
            text = f.read()
        name = os.path.relpath(page, ROOT)
        if args.check:
            outdated_blocks = stale(text)
            if outdated_blocks:
                print(f"{name} is stale for {', '.join(outdated_blocks)}: run python "
                      "benchmarks/readme.py", file=sys.stderr)
                outdated += 1
            continue
        if BLOCK.search(text) or INDEX.search(text):
            new = generated(text)  # before the page is opened for writing: the index reads it
            with open(page, "w") as f:
                f.write(new)
            print(f"{name}: {len(BLOCK.findall(text))} generated blocks")
    return 1 if outdated else 0


if __name__ == "__main__":
    sys.exit(main())
