"""The feature side of the seam: what kdist binds to a model at compile (`options`, `state`), what
it does at each hook point (`keras_hooks.KdistHooks`) and around `fit` (`dispatch`).

>>> from kdist.training.options import TrainingOptions
>>> TrainingOptions.parse(compression="fp16").compression
FP16(min_compression_rate=1.0, start_step=0)
"""
