"""`kdist bundle make|verify|install`: kdist and its dependencies for a host without a package
index (`kdist.bundle`)."""

from __future__ import annotations

import os
import sys

from kdist import exit_codes
from kdist.cli import parsing
from kdist.cluster.spec import ClusterSpecError

# Imported inside functions: kdist.bundle, which `kdist --help` must not load.


def add(commands) -> None:
    from kdist.bundle import CUDA_SETS

    bundle = commands.add_parser("bundle", help="kdist and its dependencies (optionally the CUDA 12 "
                                                 "libraries) for a host without a package index")
    bundle.set_defaults(run=run)
    bundle_commands = bundle.add_subparsers(dest="bundle_command", metavar="COMMAND", required=True)
    make = bundle_commands.add_parser(
        "make", help="download the wheels for a target Python and platform, pack them into "
                     "numbered xz pieces with a manifest of SHA-256 sums")
    make.add_argument("--out", required=True, help="new or empty directory for the bundle")
    make.add_argument("--requirement", action="append", default=None,
                      help="what to bundle (repeatable; default: this kdist, built from its "
                           "source, with its dependencies)")
    make.add_argument("--wheels", default=None,
                      help="pack the wheels already in this directory instead of downloading")
    make.add_argument("--cuda", default="none", choices=sorted(CUDA_SETS),
                      help="TensorFlow's CUDA 12 libraries too: minimal (a GPU registers), "
                           "nccl (and NCCL all-reduce), full (TensorFlow's and-cuda extra)")
    make.add_argument("--python", default=None, help="the target's Python, e.g. 3.12 "
                                                     "(default: this one)")
    make.add_argument("--platform", action="append", default=None,
                      help="the target's pip platform tag (repeatable; default: manylinux x86_64)")
    make.add_argument("--piece-mib", type=parsing.number(float, 0, False, "a positive number of MiB"),
                      default=60.0, help="largest piece, in MiB (default 60)")
    verify = bundle_commands.add_parser("verify", help="check every piece against the manifest")
    verify.add_argument("bundle", help="the bundle's directory (from kdist bundle make)")
    install = bundle_commands.add_parser(
        "install", help="verify, unpack and pip install --no-index into a target directory")
    install.add_argument("bundle", help="the bundle's directory (from kdist bundle make)")
    install.add_argument("--target", required=True, help="directory to install into "
                                                         "(then PYTHONPATH=TARGET)")
    install.add_argument("--requirement", action="append", default=None,
                         help="what to install (default: every wheel of the bundle)")


def run(args) -> int:
    from kdist import bundle

    if args.bundle_command == "verify":
        manifest = bundle.verify(args.bundle)
        print(f"{args.bundle}: {len(manifest['pieces'])} pieces verified, "
              f"{len(manifest['wheels'])} wheels")
        return 0
    if args.bundle_command == "install":
        try:
            os.makedirs(args.target, exist_ok=True)
        except OSError as err:
            raise ClusterSpecError("--target", f"cannot create {args.target!r} ({err.strerror})",
                                   "give a directory you can write") from None
        code = bundle.install(args.bundle, args.target, args.requirement)
        if code == 0:
            print(f"installed into {args.target}; use it with PYTHONPATH={args.target}")
        return exit_codes.USAGE if code else 0
    return _make(args, bundle)


def _make(args, bundle) -> int:
    import tempfile

    target = bundle.Target(python=args.python or bundle.Target.python,
                           platforms=tuple(args.platform or bundle.Target.platforms))
    with tempfile.TemporaryDirectory(prefix="kdist-wheels-") as downloads:
        wheels_dir = args.wheels or downloads
        if not args.wheels:
            requirements = args.requirement or [_kdist_wheel(downloads)]
            bundle.download(requirements + list(bundle.CUDA_SETS[args.cuda]), downloads, target)
        manifest = bundle.make(wheels_dir, args.out, args.piece_mib)
    total = sum(p["bytes"] for p in manifest["pieces"]) / bundle.MIB
    print(f"{args.out}: {len(manifest['wheels'])} wheels in {len(manifest['pieces'])} pieces, "
          f"{total:.1f} MiB (at most {args.piece_mib:g} MiB each)")
    return 0


def _kdist_wheel(into: str) -> str:
    """This kdist as a wheel: built from its source checkout."""
    import subprocess

    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.isfile(os.path.join(source, "setup.cfg")):
        raise ClusterSpecError("--requirement", "this kdist was not installed from a source "
                               "checkout, so kdist cannot build its own wheel",
                               "pass --requirement with kdist's wheel file")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                             "--wheel-dir", into, source], capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterSpecError("--requirement", f"building kdist's wheel failed "
                               f"({(result.stderr.strip().splitlines() or ['?'])[-1]})",
                               "pass --requirement with kdist's wheel file")
    return next(os.path.join(into, n) for n in os.listdir(into) if n.startswith("kdist-"))
