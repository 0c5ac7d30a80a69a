"""The launcher-runtime contract (`kdist/envvars.py`): every KDIST_* variable named in one place,
each read or written by kdist, docs/environment.md generated from it."""

import glob
import io
import os
import re
import tokenize

from kdist import envvars

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = re.compile(r"\bKDIST_[A-Z_]*[A-Z]\b")
SOURCES = [p for p in glob.glob(os.path.join(ROOT, "kdist", "**", "*.py"), recursive=True)
           + glob.glob(os.path.join(ROOT, "strategies", "**", "*.py"), recursive=True)
           if not p.endswith(os.path.join("kdist", "envvars.py"))]


def strings_and_comments(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        tokens = tokenize.generate_tokens(io.StringIO(f.read()).readline)
        return [t.string for t in tokens if t.type in (tokenize.STRING, tokenize.COMMENT)]


def test_code_spells_no_variable_name_outside_the_contract():
    """A variable's name as a whole string (its definition) lives only in kdist/envvars.py;
    messages, comments and docstrings may mention only variables the contract names."""
    spelled, unknown = [], []
    for path in SOURCES:
        for text in strings_and_comments(path):
            if re.fullmatch(r"[rbfu]*(['\"])KDIST_[A-Z_]*[A-Z]\1", text):
                spelled.append(f"{os.path.relpath(path, ROOT)}: {text}")
            unknown += [f"{os.path.relpath(path, ROOT)}: {n}" for n in NAME.findall(text)
                        if n not in envvars.CONTRACT]
    assert spelled == [], "name them through kdist.envvars"
    assert unknown == [], "add them to kdist/envvars.py"


def test_every_variable_of_the_contract_is_used_by_kdist():
    code = "".join(open(p, encoding="utf-8").read() for p in SOURCES)
    constants = {value: name for name, value in vars(envvars).items()
                 if isinstance(value, str) and value in envvars.CONTRACT}
    assert sorted(constants.values()) == sorted(  # one constant per variable
        name for name, value in vars(envvars).items() if isinstance(value, str)
        and value.startswith("KDIST_"))
    unused = [v for v, name in constants.items() if not re.search(rf"envvars\.{name}\b", code)]
    assert len(envvars.CONTRACT) >= 20 and unused == []


def test_the_environment_page_is_generated_from_the_contract():
    with open(os.path.join(ROOT, "docs", "environment.md"), encoding="utf-8") as f:
        assert f.read() == envvars.render(), \
            "run: python -m kdist.envvars > docs/environment.md"


def test_the_docs_mention_only_variables_of_the_contract_or_the_suite():
    """The README and docs name kdist's variables, and the test suite's own (read in tests/ and
    .ci/, e.g. KDIST_TEST_TIMEOUT_SCALE); no other, such as a renamed one."""
    suite = {n for p in glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True)
             + [p for p in glob.glob(os.path.join(ROOT, ".ci", "*")) if os.path.isfile(p)]
             for n in NAME.findall(open(p, encoding="utf-8").read())}
    pages = [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md")),
             *glob.glob(os.path.join(ROOT, "examples", "*.py"))]
    unknown = [f"{os.path.relpath(p, ROOT)}: {n}" for p in pages
               for n in NAME.findall(open(p, encoding="utf-8").read())
               if n not in envvars.CONTRACT and n not in suite]
    assert unknown == []
