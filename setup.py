"""Package discovery (setup.cfg holds everything else): every package under kdist/ is found, never
listed, and the repository's top-level strategies/ folder installs as kdist.strategies."""

from setuptools import find_packages, setup

STRATEGIES = {"kdist.strategies": "strategies"}

setup(
    packages=find_packages(include=["kdist", "kdist.*"])
    + [f"kdist.strategies.{p}" for p in find_packages("strategies")] + list(STRATEGIES),
    package_dir=STRATEGIES,
)
