"""Independent float64 numpy oracle for lattice (imports only numpy).

The ground truth every route is compared with; see /work/shared/SEMANTICS.md.
"""

from .conv import (
    TOLERANCES,
    assert_close,
    conv_backward,
    conv_forward,
    round_to_dtype,
    tolerance,
    weight_from_kcc,
    weight_to_kcc,
)
from .geometry import as_triple, floor_div, kernel_offsets, kernel_volume
from .quantize import sparse_quantize
from .relations import (
    Relation,
    forward_relation,
    generative_relation,
    relation_dense_map,
    subm_relation,
    target_relation,
    transposed_relation,
)

__all__ = [
    "TOLERANCES",
    "Relation",
    "as_triple",
    "assert_close",
    "conv_backward",
    "conv_forward",
    "floor_div",
    "forward_relation",
    "generative_relation",
    "kernel_offsets",
    "kernel_volume",
    "relation_dense_map",
    "round_to_dtype",
    "sparse_quantize",
    "subm_relation",
    "target_relation",
    "tolerance",
    "transposed_relation",
    "weight_from_kcc",
    "weight_to_kcc",
]
