"""kdist layers: variables split over parameter servers.

>>> import kdist
>>> kdist.layers.PartitionedDense(16, num_shards=2)       # doctest: +ELLIPSIS
<PartitionedDense name=partitioned_dense..., built=False>
"""

from kdist.layers.partitioned import PartitionedDense, PartitionedEmbedding

__all__ = ["PartitionedDense", "PartitionedEmbedding"]
