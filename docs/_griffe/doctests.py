"""A griffe extension for the API reference: the docstrings' doctest examples (`>>>` lines, their
continuations and expected output) are shown as Python console code, not as Markdown quotes."""

import griffe


def fence_doctests(text: str) -> str:
    out, inside = [], False
    for line in text.split("\n"):
        stripped = line.lstrip()
        if not inside and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}```pycon")
            inside = True
        elif inside and not stripped:
            out.append(f"{indent}```")
            inside = False
        out.append(line)
    if inside:
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
