"""The gradient exchange: how the replicas' gradients are summed, in one pipeline (`Exchange`:
accumulate, weigh, bucket, compress or route per device group, unweigh), over `Comm`'s
collectives, with the phases of `kdist.exchange.phases.PhaseCallback`.

>>> from kdist.exchange import buckets
>>> buckets.buckets([4096, 16, 65536, 40], bucket_bytes=1024)
[[3, 2], [1, 0]]
"""

from kdist.exchange.comm import Comm, scalar_means
from kdist.exchange.pipeline import Exchange, Phase, plain_sum

__all__ = ["Comm", "Exchange", "Phase", "plain_sum", "scalar_means"]
