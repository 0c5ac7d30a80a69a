"""`kdist bundle`: kdist and everything it needs, for a host without a package index.

Air-gapped clusters, and GPU hosts that accept only small uploads, install from a bundle:

    kdist bundle make --out bundle --python 3.12 --cuda minimal      # here, with an index
    kdist bundle verify bundle                                        # there: every piece present?
    kdist bundle install bundle --target /opt/site                    # there: pip --no-index

`make` downloads the wheels of kdist and its dependencies for the target Python and platform
(`pip download --only-binary=:all:`), optionally with TensorFlow's CUDA 12 libraries, packs them
into one tar re-compressed with xz, and cuts it into numbered pieces of at most `--piece-mib` MiB,
with a manifest holding every piece's SHA-256 and size and every wheel's name and SHA-256. `verify`
checks the pieces against the manifest; `install` verifies, unpacks the wheels and installs them
with `pip install --no-index` into a target directory, printing what pip could not find.

The CUDA sets (TensorFlow loads the CUDA 12 sonames, through ``$ORIGIN/../nvidia/<pkg>/lib``, so
they install into the same site-packages):

- ``minimal``: what TensorFlow needs to register a GPU (cudart, cuBLAS, cuFFT, cuSOLVER, cuSPARSE,
  cuDNN; nvJitLink for cuSPARSE), TensorFlow's dlopen check;
- ``nccl``: minimal plus NCCL and NVRTC, for the NCCL all-reduce of Mirrored strategies;
- ``full``: TensorFlow's ``and-cuda`` extra.

>>> pieces_for(130, piece_mib=60)
3
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import io
import json
import lzma
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

from kdist.validators import UsageError

MANIFEST = "manifest.json"
FORMAT = "kdist-bundle/1"
PIECE = "piece-{:04d}.bin"
MIB = 1 << 20
# TensorFlow 2.21's CUDA 12 wheels, by set (the names of its `and-cuda` extra).
MINIMAL = ("nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12", "nvidia-cufft-cu12",
           "nvidia-cusolver-cu12", "nvidia-cusparse-cu12", "nvidia-cudnn-cu12",
           "nvidia-nvjitlink-cu12")
CUDA_SETS = {"none": (), "minimal": MINIMAL,
             "nccl": MINIMAL + ("nvidia-nccl-cu12", "nvidia-cuda-nvrtc-cu12"),
             "full": ("tensorflow[and-cuda]",)}


class BundleError(RuntimeError):
    """A bundle that cannot be made, verified or installed: names the piece or file and the fix."""

    def __init__(self, what: str, problem: str, fix: str):
        super().__init__(f"{what}: {problem}. Fix: {fix}")


def pieces_for(total_mib: float, piece_mib: float) -> int:
    """How many pieces `total_mib` MiB makes in pieces of `piece_mib`."""
    return max(1, math.ceil(total_mib / piece_mib))


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------ make
@dataclasses.dataclass(frozen=True)
class Target:
    """The host the bundle is for: its Python (``3.12``) and pip platform tags."""

    python: str = f"{sys.version_info.major}.{sys.version_info.minor}"
    platforms: tuple[str, ...] = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                                  "manylinux_2_17_x86_64", "manylinux2014_x86_64")

    def pip_arguments(self) -> list[str]:
        if not re.fullmatch(r"3\.\d+", self.python):
            raise UsageError("--python", f"{self.python!r} is not a Python version",
                             "write e.g. 3.12")
        platforms = [argument for tag in self.platforms for argument in ("--platform", tag)]
        return ["--only-binary=:all:", "--implementation", "cp", "--python-version",
                self.python, *platforms]


def download(requirements: list[str], into: str, target: Target) -> None:
    """`pip download`s `requirements` and their dependencies for `target` into `into`."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", into,
               *target.pip_arguments(), *requirements]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise BundleError("pip download", last, "check the requirements, the target's Python and "
                          "platform, and that this host reaches the package index")


def make(wheels_dir: str, out: str, piece_mib: float = 60, level: int = 6) -> dict:
    """Packs every wheel of `wheels_dir` into `out`: numbered pieces of at most `piece_mib` MiB of
    one xz-compressed tar, and the manifest. Returns the manifest."""
    if not piece_mib > 0:
        raise UsageError("--piece-mib", f"{piece_mib!r} is not a size", "use a positive number")
    wheels = sorted(glob.glob(os.path.join(wheels_dir, "*.whl")))
    if not wheels:
        raise BundleError(wheels_dir, "holds no wheel", "download the wheels first (kdist bundle "
                          "make --requirement ...)")
    os.makedirs(out, exist_ok=True)
    if os.listdir(out):
        raise BundleError(out, "is not empty", "give a new or empty directory to --out")
    writer = _PieceWriter(out, int(piece_mib * MIB))
    compressor = lzma.LZMACompressor(preset=level)
    with tarfile.open(fileobj=_Compressing(writer, compressor), mode="w|") as archive:
        for wheel in wheels:
            archive.add(wheel, arcname=os.path.basename(wheel))
    writer.write(compressor.flush())
    writer.close()
    manifest = {"format": FORMAT, "piece_bytes": int(piece_mib * MIB),
                "pieces": [{"name": os.path.basename(p), "bytes": os.path.getsize(p),
                            "sha256": sha256(p)} for p in writer.paths],
                "wheels": [{"name": os.path.basename(w), "bytes": os.path.getsize(w),
                            "sha256": sha256(w)} for w in wheels]}
    with open(os.path.join(out, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    return manifest


class _PieceWriter:
    """Bytes into piece-0000.bin, piece-0001.bin, ..., each at most `limit` bytes."""

    def __init__(self, folder: str, limit: int):
        self.folder, self.limit, self.paths = folder, max(1, limit), []
        self._file, self._left = None, 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._left == 0:
                self._next()
            chunk = view[:self._left]
            self._file.write(chunk)
            self._left -= len(chunk)
            view = view[len(chunk):]

    def _next(self) -> None:
        if self._file is not None:
            self._file.close()
        self.paths.append(os.path.join(self.folder, PIECE.format(len(self.paths))))
        self._file, self._left = open(self.paths[-1], "wb"), self.limit

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class _Compressing(io.RawIOBase):
    """A write-only stream that compresses into a `_PieceWriter` (what tarfile writes to)."""

    def __init__(self, writer: _PieceWriter, compressor):
        self.writer, self.compressor = writer, compressor

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.writer.write(self.compressor.compress(bytes(data)))
        return len(data)


# ------------------------------------------------------------------ verify and install
def read_manifest(folder: str) -> dict:
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise BundleError(path, "missing", "copy the bundle's manifest.json with its pieces") \
            from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BundleError(path, f"unreadable ({err})", "copy manifest.json again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(path, f"is not a {FORMAT} manifest", "copy the bundle's manifest.json")
    return manifest


def verify(folder: str) -> dict:
    """The bundle's manifest, once every piece is present with its size and SHA-256; otherwise
    `BundleError` naming every missing or damaged piece."""
    manifest = read_manifest(folder)
    missing, damaged = [], []
    for piece in manifest["pieces"]:
        path = os.path.join(folder, piece["name"])
        if not os.path.isfile(path):
            missing.append(piece["name"])
        elif os.path.getsize(path) != piece["bytes"] or sha256(path) != piece["sha256"]:
            damaged.append(piece["name"])
    if missing or damaged:
        problems = ([f"missing {', '.join(missing)}"] if missing else []) + \
            ([f"damaged (size or SHA-256) {', '.join(damaged)}"] if damaged else [])
        raise BundleError(folder, "; ".join(problems), "copy those pieces again from the bundle "
                          "that was made (kdist bundle verify names what is still wrong)")
    return manifest


class _Pieces(io.RawIOBase):
    """The pieces of a bundle, read as one stream."""

    def __init__(self, folder: str, names: list[str]):
        self.paths = [os.path.join(folder, name) for name in names]
        self._file = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while True:
            if self._file is None:
                if not self.paths:
                    return 0
                self._file = open(self.paths.pop(0), "rb")
            count = self._file.readinto(buffer)
            if count:
                return count
            self._file.close()
            self._file = None


def unpack(folder: str, into: str) -> list[str]:
    """Verifies the bundle and writes its wheels into `into`; returns their paths, each checked
    against the manifest's SHA-256."""
    manifest = verify(folder)
    stream = io.BufferedReader(_Pieces(folder, [p["name"] for p in manifest["pieces"]]))
    with lzma.open(stream) as tar_stream, tarfile.open(fileobj=tar_stream, mode="r|") as archive:
        for member in archive:
            if not member.isfile() or os.path.basename(member.name) != member.name:
                raise BundleError(member.name, "is not a wheel at the top of the bundle",
                                  "make the bundle again with kdist bundle make")
            with open(os.path.join(into, member.name), "wb") as f:
                shutil.copyfileobj(archive.extractfile(member), f)
    paths = []
    for wheel in manifest["wheels"]:
        path = os.path.join(into, wheel["name"])
        if not os.path.isfile(path) or sha256(path) != wheel["sha256"]:
            raise BundleError(wheel["name"], "differs from what was packed",
                              "make the bundle again with kdist bundle make")
        paths.append(path)
    return paths


def install(folder: str, target: str, requirements: list[str] | None = None) -> int:
    """Unpacks the bundle and installs `requirements` (default: every wheel) into `target` with
    `pip install --no-index`; prints what pip could not find. Returns pip's exit code."""
    with tempfile.TemporaryDirectory(prefix="kdist-bundle-") as wheels_dir:
        wheels = unpack(folder, wheels_dir)
        command = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links",
                   wheels_dir, "--target", target, "--no-warn-script-location", "--quiet",
                   *(requirements or wheels)]
        result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        missing = re.findall(r"No matching distribution found for (\S+)", result.stderr)
        what = f"missing from the bundle: {', '.join(missing)}" if missing else \
            (result.stderr.strip().splitlines() or ["pip failed"])[-1]
        print(f"kdist: error: bundle {folder}: {what}. Fix: make the bundle with those "
              "requirements (kdist bundle make --requirement ...)", file=sys.stderr)
    return result.returncode
