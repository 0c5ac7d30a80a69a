"""The layers of docs/design.md, enforced: every import between kdist's parts (inside functions
included) points to the part's own layer or one below, and no two parts import each other, directly
or through others. The layer list is read from the page, so the page and the code cannot drift.
An import between parts inside a function is there only to keep a module out of `import kdist`
and the command line's start, and says so."""

import ast
import os
import re

from conftest import ROOT, run_python
from test_package import imports_of, source_modules

DESIGN = os.path.join(ROOT, "docs", "design.md")


def layers() -> dict[str, int]:
    """Part -> its layer (1 = bottom), from the numbered list under '## Layers' in design.md."""
    text = open(DESIGN, encoding="utf-8").read()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    found = {}
    for number, body in re.findall(r"^(\d+)\. (.*(?:\n   .*)*)", section, re.M):
        for part in re.findall(r"`([a-z0-9_]+)`", body.split(":", 1)[1]):
            assert part not in found, f"design.md places {part} in two layers"
            found[part] = int(number)
    return found


def part_of(module: str) -> str | None:
    """'kdist.exchange.comm' -> 'exchange'; 'kdist.strategies.registry' -> 'strategies'; the
    package's own __init__ (the public names, above every layer) -> None."""
    names = module.split(".")
    return names[1] if len(names) > 1 else None


def part_graph() -> dict[str, dict[str, list[str]]]:
    """part -> {imported part: ['module -> module', ...]}, every import at any depth."""
    graph: dict[str, dict[str, list[str]]] = {}
    for module, path in source_modules().items():
        source = part_of(module)
        if source is None:
            continue
        graph.setdefault(source, {})
        for target in imports_of(module, path):
            imported = part_of(target)
            if imported not in (None, source):
                graph[source].setdefault(imported, []).append(f"{module} -> {target}")
    return graph


def cycles(graph) -> list[list[str]]:
    """The strongly connected parts of more than one part (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, {})):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_part_has_a_layer_and_every_layer_a_part():
    graph, placed = part_graph(), layers()
    assert len(placed) > 25, "the layer list of design.md was not read"
    assert not sorted(set(graph) - set(placed)), "parts design.md does not place"
    assert not sorted(set(placed) - set(graph)), "design.md places parts that do not exist"


def test_no_part_imports_a_higher_layer():
    graph, layer = part_graph(), layers()
    upward = [f"{edge} (layer {layer[source]} imports layer {layer[target]})"
              for source, targets in graph.items() if source in layer
              for target, edges in targets.items()
              if layer.get(target, 0) > layer[source] for edge in edges]
    assert not upward, "imports against the layers of docs/design.md:\n" + "\n".join(upward)


def test_no_two_parts_import_each_other():
    graph = part_graph()
    assert not cycles(graph), f"parts that import each other: {cycles(graph)}"


def test_the_cycle_check_sees_a_cycle():
    graph = {"scope": {"training": ["x"]}, "training": {"scope": ["y"]}, "validators": {}}
    assert cycles(graph) == [["scope", "training"]]
    assert cycles({"a": {"b": []}, "b": {}}) == []


def loaded_at_start() -> set[str]:
    """The kdist modules `import kdist` and the command line's start load."""
    result = run_python(["-c", "import sys, kdist, kdist.cli; "
                         "print(' '.join(m for m in sys.modules if m.startswith('kdist')))"],
                        timeout=60)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def imports_inside_functions(module: str, path: str) -> list[tuple[int, list[str]]]:
    """(line, [imported kdist module of another part]) of each import inside a function."""
    known = source_modules()
    found = []
    for function in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and \
                    (node.module or "").startswith("kdist"):
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                         else node.module for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("kdist.")]
            else:
                continue
            others = [n for n in names if part_of(n) not in (None, part_of(module))]
            if others:
                found.append((node.lineno, others))
    return found


def test_an_import_between_parts_inside_a_function_keeps_a_module_out_of_the_start_and_says_so():
    start = loaded_at_start()
    assert {"kdist", "kdist.scope", "kdist.cli"} <= start and "kdist.exchange.comm" not in start
    needless, unsaid, justified = [], [], 0
    for module, path in source_modules().items():
        source = open(path, encoding="utf-8").read()
        for line, names in imports_inside_functions(module, path):
            if module not in start or all(n in start for n in names):
                needless.append(f"{module}:{line} imports {names} inside a function: import it at "
                                "the top (it keeps nothing out of import kdist)")
            elif "# Imported inside functions:" not in source:
                unsaid.append(f"{module}:{line}: say why under the imports ('# Imported inside "
                              "functions: ..., which import kdist must not load')")
            else:
                justified += 1
    assert not needless and not unsaid, "\n".join(needless + unsaid)
    assert justified > 10, "the imports inside functions were not read"
