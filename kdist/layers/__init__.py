"""kdist layers: variables split over parameter servers (Partitioned*) or devices (ModelParallel*,
also from a Keras `LayoutMap`: `from_layout_map`).

>>> import kdist
>>> kdist.layers.PartitionedDense(16, num_shards=2)       # doctest: +ELLIPSIS
<PartitionedDense name=partitioned_dense..., built=False>
"""

from kdist.layers.layout import LayoutError, from_layout_map
from kdist.layers.model_parallel import ModelParallelDense
from kdist.layers.model_parallel_embedding import ModelParallelEmbedding
from kdist.layers.partitioned import PartitionedDense, PartitionedEmbedding

__all__ = ["LayoutError", "ModelParallelDense", "ModelParallelEmbedding", "PartitionedDense",
           "PartitionedEmbedding", "from_layout_map"]
