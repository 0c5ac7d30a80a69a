"""The suite's tiers, marked from measured lists: `compat` and `quick` (see setup.cfg's markers).

tests/tiers/compat.txt and tests/tiers/quick.txt each name test functions (`FILE::FUNCTION`, every
parameter of one), chosen by `.ci/tiers.py select` from a coverage run of the whole suite; a listed
function gets the tier's marker at collection. tests/test_tiers.py fails when a listed test no
longer exists, so a rename cannot drop a test from a tier unnoticed.
"""

import os

import pytest

TIERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiers")
ROOT = os.path.dirname(os.path.dirname(TIERS))


def listed(tier: str) -> dict[str, str]:
    """FILE::FUNCTION -> the reason it is in `tier`, from tests/tiers/TIER.txt."""
    names = {}
    for line in open(os.path.join(TIERS, f"{tier}.txt")):
        line = line.split("#", 1)
        name = line[0].strip()
        if name:
            names[name] = line[1].strip() if len(line) > 1 else ""
    return names


def function_id(item) -> str:
    """`tests/test_x.py::test_y` for every parameter of test_y (a doctest: its module's id)."""
    path = os.path.relpath(str(item.path), ROOT)
    name = getattr(item, "originalname", None) or item.name.split("[")[0]
    return f"{path}::{name}"


def shared_fixtures(item) -> list[str]:
    """The fixtures of `item` that outlive one test (scope module, class, package or session)."""
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return sorted(f"{name}@{defs[-1].baseid}" for name, defs in definitions.items()
                  if defs and defs[-1].scope != "function" and defs[-1].baseid)  # not pytest's own


def pytest_collection_modifyitems(config, items):
    if os.environ.get("KDIST_TIER_UNITS"):  # .ci/tiers.py: which tests share which fixtures
        import json

        # every process of `pytest -n` collects the same items: each writes whole, then renames
        path = os.environ["KDIST_TIER_UNITS"]
        with open(f"{path}.{os.getpid()}", "w") as out:
            json.dump({function_id(item): shared_fixtures(item) for item in items}, out)
        os.replace(f"{path}.{os.getpid()}", path)
    tiers = {tier: listed(tier) for tier in ("compat", "quick")}
    for item in items:
        for tier, names in tiers.items():
            if function_id(item) in names:
                item.add_marker(getattr(pytest.mark, tier))
