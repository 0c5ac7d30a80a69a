"""Converts the UCI handwritten digits into examples/data/uci_digits.npz (run once; needs scikit-learn).

The data: E. Alpaydin and C. Kaynak, "Optical Recognition of Handwritten Digits", UCI Machine Learning
Repository (1998), CC BY 4.0, https://doi.org/10.24432/C50P49, as bundled with scikit-learn
(`sklearn.datasets.load_digits`: the 1,797-image test part, 8x8 pixels, values 0..16).
"""

import os

import numpy as np
from sklearn.datasets import load_digits

digits = load_digits()
order = np.random.default_rng(0).permutation(len(digits.target))
images, labels = digits.images[order].astype("uint8"), digits.target[order].astype("uint8")
test = 360  # 20% held out
np.savez_compressed(os.path.join(os.path.dirname(os.path.abspath(__file__)), "uci_digits.npz"),
                    x_train=images[test:], y_train=labels[test:], x_test=images[:test],
                    y_test=labels[:test])
