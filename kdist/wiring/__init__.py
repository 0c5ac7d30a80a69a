"""The wiring, the feature side of the seam: the options kdist binds to a model at compile
(`options`, kept in `kdist.model_state`), what it does at each hook point
(`keras_hooks.KdistHooks`) and around `fit` (`dispatch`, the workers' agreement on the fit's
arguments in `agreement`), and `kdist verify`'s record and replay (`verify`, `comparison`).

>>> from kdist.wiring.options import TrainingOptions
>>> TrainingOptions.parse(compression="fp16").compression
FP16(min_compression_rate=1.0, start_step=0)
"""
