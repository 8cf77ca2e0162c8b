"""Every validation branch raises the documented error kind with the message format
``[op] argument: expected ..., got ...`` (DESIGN.md "Errors"); inputs are never mutated."""
from __future__ import annotations

import pytest
import torch

import lattice
from lattice import SparseTensor, ops
from conftest import random_coords

INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)


@pytest.fixture
def x(rng):
    c = random_coords(rng, 20)
    return SparseTensor(torch.from_numpy(c), torch.randn(c.shape[0], 2))


@pytest.fixture
def w3():
    return torch.randn(4, 3, 3, 3, 2)


def _st(rows, stride=1, c=2, dtype=torch.float32):
    coords = torch.tensor(rows, dtype=torch.int64).reshape(-1, 4).to(torch.int32)
    return SparseTensor(coords, torch.zeros(coords.shape[0], c, dtype=dtype), stride=stride)


# ---- SparseTensor ------------------------------------------------------------------------------


def test_sparse_tensor_float_coords_raise_type_error():
    with pytest.raises(TypeError, match=r"^\[SparseTensor\] coords: expected an integer tensor \(int32\), got torch.float32"):
        SparseTensor(torch.zeros(3, 4), torch.zeros(3, 1))


def test_sparse_tensor_bool_coords_raise_type_error():
    with pytest.raises(TypeError, match=r"^\[SparseTensor\] coords: expected an integer tensor"):
        SparseTensor(torch.zeros(3, 4, dtype=torch.bool), torch.zeros(3, 1))


def test_sparse_tensor_list_coords_raise_type_error():
    with pytest.raises(TypeError, match=r"^\[SparseTensor\] coords: expected a torch.Tensor or numpy.ndarray, got list"):
        SparseTensor([[0, 0, 0, 0]], torch.zeros(1, 1))


@pytest.mark.parametrize("shape", [(3, 3), (3, 5), (12,), (3, 4, 1)])
def test_sparse_tensor_coords_wrong_shape_raise_value_error(shape):
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] coords: expected shape \(N, 4\)"):
        SparseTensor(torch.zeros(shape, dtype=torch.int32), torch.zeros(3, 1))


@pytest.mark.parametrize("bad", [INT32_MAX + 1, INT32_MIN - 1])
def test_sparse_tensor_int64_coords_outside_int32_raise_value_error(bad):
    c = torch.tensor([[0, 0, 0, 0], [0, 1, bad, 2]], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] coords: expected values within int32"):
        SparseTensor(c, torch.zeros(2, 1))


def test_sparse_tensor_int64_coords_at_int32_limits_are_accepted():
    c = torch.tensor([[0, INT32_MAX, INT32_MIN, 0]], dtype=torch.int64)
    t = SparseTensor(c, torch.zeros(1, 1))
    assert t.coords.dtype == torch.int32 and t.coords.tolist() == [[0, INT32_MAX, INT32_MIN, 0]]


@pytest.mark.parametrize("feats_shape", [(4, 2), (2, 2), (3,), (3, 2, 1)])
def test_sparse_tensor_feats_wrong_rows_raise_value_error(feats_shape):
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] feats: expected shape \(N=3, C\)"):
        SparseTensor(torch.zeros(3, 4, dtype=torch.int32).cumsum(0), torch.zeros(feats_shape))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_sparse_tensor_int_feats_raise_type_error(dtype):
    with pytest.raises(TypeError, match=r"^\[SparseTensor\] feats: expected a float tensor"):
        SparseTensor(torch.zeros(1, 4, dtype=torch.int32), torch.zeros(1, 2, dtype=dtype))


@pytest.mark.parametrize("stride", [0, -1, (1, 0, 1)])
def test_sparse_tensor_non_positive_stride_raises_value_error(stride):
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] stride: expected positive integers"):
        SparseTensor(torch.zeros(1, 4, dtype=torch.int32), torch.zeros(1, 1), stride=stride)


def test_sparse_tensor_duplicate_rows_raise_with_validate_true():
    c = torch.tensor([[0, 1, 2, 3], [1, 1, 2, 3], [0, 1, 2, 3]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] coords: expected unique rows, got row 2 \(0, 1, 2, 3\) equal to row 0"):
        SparseTensor(c, torch.zeros(3, 1), validate=True)
    t = SparseTensor(c, torch.zeros(3, 1))  # not checked without validate
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] coords: expected unique rows"):
        t.validate()


@pytest.mark.parametrize("op, kw", [
    ("subm_conv3d", {}),
    ("conv3d", dict(stride=2)),
    ("conv_transpose3d", {}),
    ("generative_conv_transpose3d", {}),
])
def test_conv_duplicate_coordinate_rows_raise_on_first_conv(op, kw):
    c = torch.tensor([[0, 5, -5, 0], [0, 0, 0, 0], [0, 5, -5, 0]], dtype=torch.int32)
    t = SparseTensor(c, torch.zeros(3, 2))
    with pytest.raises(ValueError, match=rf"^\[{op}\] coords: expected unique rows, got row 2"):
        getattr(ops, op)(t, torch.zeros(1, 3, 3, 3, 2), **kw)


def test_conv_duplicate_target_rows_raise():
    x = _st([[0, 0, 0, 0], [0, 1, 0, 0]])
    target = _st([[0, 0, 0, 0], [0, 0, 0, 0]], c=1)
    with pytest.raises(ValueError, match=r"^\[conv3d\] coords: expected unique rows"):
        ops.conv3d(x, torch.zeros(1, 3, 3, 3, 2), coordinates=target)


def test_sparse_tensor_batch_counts_not_summing_to_n_raise_value_error():
    c = torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] batch_counts: expected counts summing to N = 2, got sum 1"):
        SparseTensor(c, torch.zeros(2, 1), batch_counts=[1, 0])
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] batch_counts: expected counts summing to N = 2, got a sum above N"):
        SparseTensor(c, torch.zeros(2, 1), batch_counts=[1, 2])


def test_sparse_tensor_negative_batch_count_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] batch_counts: expected non-negative counts"):
        SparseTensor(torch.zeros(1, 4, dtype=torch.int32), torch.zeros(1, 1), batch_counts=[2, -1])


def test_sparse_tensor_batch_counts_disagreeing_with_coords_raise_value_error():
    c = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] batch_counts: expected batch_counts\[0\] == 2"):
        SparseTensor(c, torch.zeros(3, 1), batch_counts=[1, 2])
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] coords: expected batch ids in \[0, 1\)"):
        SparseTensor(c, torch.zeros(3, 1), batch_counts=[3])


@pytest.mark.parametrize("counts", [3, "1", [1.5], [None]], ids=["int", "str", "float", "none"])
def test_sparse_tensor_batch_counts_not_a_sequence_of_ints_raises_with_prefix(counts):
    # a wrong Python type is a TypeError/ValueError in the [op] format, never silently truncated
    # (int(1.5) == 1) or iterated character by character ("1" -> [1])
    with pytest.raises((TypeError, ValueError), match=r"^\[SparseTensor\] batch_counts: expected"):
        SparseTensor(torch.zeros(1, 4, dtype=torch.int32), torch.zeros(1, 1), batch_counts=counts)


# ---- conv arguments ----------------------------------------------------------------------------


def test_conv_weight_dtype_mismatch_raises_type_error(x, w3):
    with pytest.raises(TypeError, match=r"^\[subm_conv3d\] weight: expected float32 \(the dtype of feats\), got float64"):
        ops.subm_conv3d(x, w3.double())


@pytest.mark.parametrize("shape", [(4, 27, 2, 1), (27, 2), (4, 3, 3, 3, 2, 1)])
def test_conv_weight_wrong_rank_raises_value_error(x, shape):
    with pytest.raises(ValueError, match=r"^\[conv3d\] weight: expected \(C_out, 3, 3, 3, C_in=2\) or \(27, C_in=2, C_out\)"):
        ops.conv3d(x, torch.randn(shape), kernel_size=3)


def test_conv_dense_weight_mismatched_c_in_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[subm_conv3d\] weight: expected \(C_out, 3, 3, 3, C_in=2\)"):
        ops.subm_conv3d(x, torch.randn(4, 3, 3, 3, 5))


def test_conv_kernel_major_weight_mismatched_c_in_or_volume_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[conv3d\] weight: expected .* or \(27, C_in=2, C_out\), got \(27, 5, 4\)"):
        ops.conv3d(x, torch.randn(27, 5, 4), kernel_size=3)
    with pytest.raises(ValueError, match=r"^\[conv3d\] weight: expected .* or \(27, C_in=2, C_out\), got \(8, 2, 4\)"):
        ops.conv3d(x, torch.randn(8, 2, 4), kernel_size=3)


def test_conv_kernel_size_mismatch_with_dense_weight_raises_value_error(x, w3):
    with pytest.raises(ValueError, match=r"^\[subm_conv3d\] weight: expected \(C_out, 5, 5, 5, C_in\) for kernel_size=\(5, 5, 5\), got \(4, 3, 3, 3, 2\)"):
        ops.subm_conv3d(x, w3, kernel_size=5)


def test_conv_missing_kernel_size_for_kernel_major_weight_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[conv3d\] kernel_size: expected a kernel size for a weight of shape \(27, 2, 4\)"):
        ops.conv3d(x, torch.randn(27, 2, 4))


@pytest.mark.parametrize("op", ["conv_transpose3d", "generative_conv_transpose3d"])
def test_transposed_conv_stride_not_dividing_input_stride_raises_value_error(op):
    t = _st([[0, 0, 0, 0]], stride=(2, 4, 3))
    with pytest.raises(ValueError, match=rf"^\[{op}\] stride: expected a divisor of the input tensor stride \(2, 4, 3\)"):
        getattr(ops, op)(t, torch.zeros(1, 2, 2, 2, 2), stride=(2, 4, 2))


@pytest.mark.parametrize("arg, value, text", [
    ("kernel_size", 0, "sizes >= 1"),
    ("kernel_size", (3, -1, 3), "sizes >= 1"),
    ("stride", 0, "strides >= 1"),
    ("stride", (1, 1, -2), "strides >= 1"),
    ("dilation", 0, "dilations >= 1"),
    ("padding", -1, "paddings >= 0"),
    ("padding", (0, 0, -3), "paddings >= 0"),
])
def test_conv3d_invalid_geometry_raises_value_error(x, arg, value, text):
    kw = dict(kernel_size=3)
    kw[arg] = value
    with pytest.raises(ValueError, match=rf"^\[conv3d\] {arg}: expected {text}, got"):
        ops.conv3d(x, torch.randn(27, 2, 4), **kw)


@pytest.mark.parametrize("op, kw", [
    ("subm_conv3d", dict(dilation=0)),
    ("conv_transpose3d", dict(padding=-1)),
    ("generative_conv_transpose3d", dict(stride=0)),
])
def test_other_convs_invalid_geometry_raise_value_error(x, op, kw):
    arg = next(iter(kw))
    with pytest.raises(ValueError, match=rf"^\[{op}\] {arg}: expected"):
        getattr(ops, op)(x, torch.randn(27, 2, 4), kernel_size=3, **kw)


@pytest.mark.parametrize("ks", [2, (3, 2, 3), (1, 1, 4)])
def test_subm_conv3d_even_kernel_raises_value_error(x, ks):
    with pytest.raises(ValueError, match=r"^\[subm_conv3d\] kernel_size: expected odd sizes on every axis"):
        ops.subm_conv3d(x, torch.randn(1, 2, 4), kernel_size=ks)


def test_conv3d_expand_with_target_raises_value_error(x, w3):
    with pytest.raises(ValueError, match=r"^\[conv3d\] expand: expected False \(expand applies to conv3d without a target\), got True"):
        ops.conv3d(x, w3, coordinates=x, expand=True)


def test_conv3d_target_at_wrong_stride_raises_value_error(x, w3):
    with pytest.raises(ValueError, match=r"^\[conv3d\] coordinates: expected a target at the output stride \(2, 2, 2\), got stride \(1, 1, 1\)"):
        ops.conv3d(x, w3, stride=2, coordinates=x)


def test_conv_transpose3d_target_at_wrong_stride_raises_value_error():
    coarse = _st([[0, 0, 0, 0]], stride=2)
    with pytest.raises(ValueError, match=r"^\[conv_transpose3d\] coordinates: expected a target at the output stride \(1, 1, 1\), got stride \(2, 2, 2\)"):
        ops.conv_transpose3d(coarse, torch.zeros(1, 2, 2, 2, 2), stride=2, coordinates=coarse)


@pytest.mark.parametrize("shape", [(5,), (4, 1), ()])
def test_conv_bias_wrong_shape_raises_value_error(x, w3, shape):
    with pytest.raises(ValueError, match=r"^\[subm_conv3d\] bias: expected shape \(C_out=4,\)"):
        ops.subm_conv3d(x, w3, torch.zeros(shape))


def test_conv_bias_wrong_dtype_raises_type_error(x, w3):
    with pytest.raises(TypeError, match=r"^\[subm_conv3d\] bias: expected float32 \(the dtype of feats\), got float64"):
        ops.subm_conv3d(x, w3, torch.zeros(4, dtype=torch.float64))


def test_conv_bias_not_a_tensor_raises_type_error(x, w3):
    with pytest.raises(TypeError, match=r"^\[subm_conv3d\] bias: expected a torch.Tensor or None, got list"):
        ops.subm_conv3d(x, w3, [0.0] * 4)


def test_conv_weight_not_a_tensor_raises_type_error(x):
    with pytest.raises(TypeError, match=r"^\[conv3d\] weight: expected a torch.Tensor.*, got list"):
        ops.conv3d(x, [[0.0] * 2] * 4)


@pytest.mark.parametrize("value, exc, text", [
    ((1, 2), ValueError, r"expected an int or 3 ints, got \(1, 2\)"),
    (True, TypeError, r"expected an int or 3 ints, got bool"),
    (1.5, TypeError, r"expected an int or 3 ints, got float"),
])
def test_conv3d_stride_not_an_int_triple_raises(x, w3, value, exc, text):
    with pytest.raises(exc, match=rf"^\[conv3d\] stride: {text}"):
        ops.conv3d(x, w3, stride=value)


@pytest.mark.parametrize("arg, value", [
    ("stride", 2**31),
    ("stride", (1, 1, -(2**31) - 1)),
    ("padding", 2**40),
    ("dilation", (1, 2**31, 1)),
    ("kernel_size", (2**31, 1, 1)),
])
def test_conv3d_geometry_outside_int32_raises_value_error_naming_the_argument(x, arg, value):
    # Kernel geometry is int32 in the core; a Python int beyond it must be a clear [op] error,
    # not a bare pybind11 cast failure.
    kw = dict(kernel_size=2)
    kw[arg] = value
    with pytest.raises(ValueError, match=rf"^\[conv3d\] {arg}: expected"):
        ops.conv3d(x, torch.zeros(8, 2, 1), **kw)


def test_sparse_tensor_stride_outside_int32_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] stride: expected"):
        SparseTensor(torch.zeros(1, 4, dtype=torch.int32), torch.zeros(1, 1), stride=2**31)


@pytest.mark.parametrize("route", ["fast", "cuda", "REFERENCE"])
def test_conv_unknown_route_name_raises_value_error(x, w3, route):
    with pytest.raises(ValueError, match=rf"^\[conv3d\] route: expected one of 'pointwise_matmul', 'gather_gemm_scatter', 'cuda_pointwise_matmul', 'implicit_gemm_sm80', 'cuda_gather_gemm_scatter', 'reference', got '{route}'$"):
        ops.conv3d(x, w3, route=route)


def test_conv_route_not_a_string_raises_type_error(x, w3):
    with pytest.raises(TypeError, match=r"^\[subm_conv3d\] route: expected a route name \(str\) or None, got int"):
        ops.subm_conv3d(x, w3, route=1)


@pytest.mark.parametrize("op", ["conv3d", "subm_conv3d", "conv_transpose3d", "generative_conv_transpose3d"])
def test_conv_torch_tensor_instead_of_sparse_tensor_raises_type_error(x, w3, op):
    with pytest.raises(TypeError, match=rf"^\[{op}\] input: expected a lattice.SparseTensor, got Tensor"):
        getattr(ops, op)(x.feats, w3)


@pytest.mark.parametrize("op", ["conv3d", "conv_transpose3d"])
def test_conv_target_not_a_sparse_tensor_raises_type_error(x, w3, op):
    with pytest.raises(TypeError, match=rf"^\[{op}\] coordinates: expected a lattice.SparseTensor, got Tensor"):
        getattr(ops, op)(x, w3, coordinates=x.coords)


@pytest.mark.parametrize("module", [lattice.nn.BatchNorm(2), lattice.nn.ReLU(), lattice.nn.Linear(2, 3)],
                         ids=["BatchNorm", "ReLU", "Linear"])
def test_nn_feature_module_torch_tensor_input_raises_type_error(module):
    name = type(module).__name__
    with pytest.raises(TypeError, match=rf"^\[{name}\] input: expected a lattice.SparseTensor, got Tensor"):
        module(torch.zeros(3, 2))


def test_nn_conv_module_torch_tensor_input_raises_type_error():
    with pytest.raises(TypeError, match=r"^\[subm_conv3d\] input: expected a lattice.SparseTensor"):
        lattice.nn.SubmConv3d(2, 3)(torch.zeros(3, 2))


@pytest.mark.parametrize("cls, ks", [(lattice.nn.Conv3d, 0), (lattice.nn.SubmConv3d, -1),
                                     (lattice.nn.ConvTranspose3d, (3, 0, 3)), (lattice.nn.GenerativeConvTranspose3d, 0)],
                         ids=["Conv3d-0", "SubmConv3d-neg", "ConvTranspose3d-303", "GenerativeConvTranspose3d-0"])
def test_nn_conv_module_non_positive_kernel_size_raises_value_error_at_construction(cls, ks):
    with pytest.raises(ValueError, match=rf"^\[{cls.__name__}\] kernel_size: expected"):
        cls(2, 3, kernel_size=ks)


def test_explain_missing_weight_argument_raises_type_error(x):
    with pytest.raises(TypeError, match=r"^\[explain\] args: expected the op's \(input, weight, ...\) arguments, got 1"):
        lattice.explain("subm_conv3d", x)


def test_explain_unknown_op_raises_value_error(x, w3):
    with pytest.raises(ValueError, match=r"^\[explain\] op: expected one of .*, got 'conv2d'"):
        lattice.explain("conv2d", x, w3)


# ---- int32 output range ------------------------------------------------------------------------


@pytest.mark.parametrize("op, row, kw", [
    ("conv_transpose3d", [0, INT32_MAX, 0, 0], dict(stride=2)),
    ("conv_transpose3d", [0, 0, INT32_MIN, 0], dict(stride=2)),
    ("conv_transpose3d", [0, 0, 0, -(2**30)], dict(stride=2, padding=1)),
    ("generative_conv_transpose3d", [0, 2**30 - 1, 0, 2**30], dict(stride=2)),
    ("conv3d", [0, INT32_MAX, 0, 0], dict(padding=1, expand=True)),
    ("conv3d", [0, 0, INT32_MIN, 0], dict(expand=True)),
])
def test_conv_output_coordinates_overflowing_int32_raise_value_error(op, row, kw):
    stride = kw.get("stride", 1) if op != "conv3d" else 1
    t = _st([[0, 0, 0, 0], row], stride=stride)
    with pytest.raises(ValueError, match=rf"^\[{op}\] coords: expected output coordinates within the int32 range .*at input row 1"):
        getattr(ops, op)(t, torch.zeros(1, 2, 2, 2, 2) if op != "conv3d" else torch.zeros(1, 3, 3, 3, 2), **kw)


def test_conv3d_output_tensor_stride_overflowing_int32_raises_value_error():
    t = _st([[0, 0, 0, 0]], stride=2**20)
    with pytest.raises(ValueError, match=r"^\[conv3d\] stride: expected an output tensor stride within int32"):
        ops.conv3d(t, torch.zeros(1, 2, 2, 2, 2), stride=2**12)


# ---- cat ---------------------------------------------------------------------------------------


def test_cat_tensors_with_different_keys_raise_value_error():
    a = _st([[0, 0, 0, 0], [0, 1, 0, 0]])
    b = _st([[0, 0, 0, 0], [0, 1, 0, 0]])  # same values, different identity
    with pytest.raises(ValueError, match=rf"^\[cat\] tensors\[1\]: expected the coordinate identity of tensors\[0\] \(key {a.key}\), got key {b.key}"):
        ops.cat([a, b])


def test_cat_empty_sequence_and_non_sparse_tensor_raise():
    with pytest.raises(ValueError, match=r"^\[cat\] tensors: expected at least one SparseTensor"):
        ops.cat([])
    a = _st([[0, 0, 0, 0]])
    with pytest.raises(TypeError, match=r"^\[cat\] tensors\[1\]: expected a lattice.SparseTensor, got Tensor"):
        ops.cat([a, a.feats])


def test_cat_same_key_concatenates_features_row_by_row():
    a = _st([[0, 0, 0, 0], [0, 1, 0, 0]])
    b = a.replace_feats(torch.tensor([[5.0], [6.0]]))
    y = ops.cat([a.replace_feats(torch.tensor([[1.0, 2.0], [3.0, 4.0]])), b])
    assert y.key == a.key and y.feats.tolist() == [[1.0, 2.0, 5.0], [3.0, 4.0, 6.0]]


# ---- sparse_quantize ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_sparse_quantize_non_finite_point_raises_naming_the_row(bad):
    p = torch.zeros(5, 3, dtype=torch.float64)
    p[3, 1] = bad
    with pytest.raises(ValueError, match=r"^\[sparse_quantize\] points: expected finite values \(no NaN or inf\), got .*row 3"):
        ops.sparse_quantize(p, 0.5)


@pytest.mark.parametrize("vs", [0.0, -1.0, (1.0, 0.0, 1.0), (1.0, 1.0, float("nan")), float("inf")])
def test_sparse_quantize_non_positive_voxel_size_raises_value_error(vs):
    with pytest.raises(ValueError, match=r"^\[sparse_quantize\] voxel_size: expected positive finite sizes"):
        ops.sparse_quantize(torch.zeros(2, 3), vs)


@pytest.mark.parametrize("shape", [(4, 2), (4,), (4, 3, 1), (3, 4)])
def test_sparse_quantize_wrong_points_shape_raises_value_error(shape):
    with pytest.raises(ValueError, match=r"^\[sparse_quantize\] points: expected shape \(P, 3\)"):
        ops.sparse_quantize(torch.zeros(shape), 1.0)


def test_sparse_quantize_integer_points_raise_type_error():
    with pytest.raises(TypeError, match=r"^\[sparse_quantize\] points: expected float32 or float64, got torch.int64"):
        ops.sparse_quantize(torch.zeros(2, 3, dtype=torch.int64), 1.0)


def test_sparse_quantize_bad_batch_indices_raise():
    with pytest.raises(ValueError, match=r"^\[sparse_quantize\] batch_indices: expected batch ids >= 0, got batch id -1 at row 1"):
        ops.sparse_quantize(torch.zeros(2, 3), 1.0, torch.tensor([0, -1]))
    with pytest.raises(ValueError, match=r"^\[sparse_quantize\] batch_indices: expected shape \(P=2,\)"):
        ops.sparse_quantize(torch.zeros(2, 3), 1.0, torch.tensor([0, 0, 0]))
    with pytest.raises(TypeError, match=r"^\[sparse_quantize\] batch_indices: expected int32 or int64"):
        ops.sparse_quantize(torch.zeros(2, 3), 1.0, torch.tensor([0.0, 1.0]))


def test_sparse_quantize_voxel_index_outside_int32_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[sparse_quantize\] points: expected voxel indices within int32"):
        ops.sparse_quantize(torch.tensor([[0.0, 0.0, 0.0], [3e9, 0.0, 0.0]], dtype=torch.float64), 1.0)


def test_sparse_quantize_unknown_route_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[sparse_quantize\] route: expected 'cuda' or 'reference', got 'fast'$"):
        ops.sparse_quantize(torch.zeros(2, 3), 1.0, route="fast")


@pytest.mark.parametrize("arg, value", [("voxel_size", None), ("voxel_size", "a"), ("voxel_size", True),
                                        ("origin", "abc"), ("origin", None)])
def test_sparse_quantize_voxel_size_or_origin_of_wrong_type_raises_type_error_with_prefix(arg, value):
    kw = {"voxel_size": 1.0}
    kw[arg] = value
    with pytest.raises(TypeError, match=rf"^\[sparse_quantize\] {arg}: expected a number or 3 numbers"):
        ops.sparse_quantize(torch.zeros(2, 3), **kw)


def test_sparse_quantize_voxel_size_wrong_length_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[sparse_quantize\] voxel_size: expected a number or 3 numbers, got 2 values"):
        ops.sparse_quantize(torch.zeros(2, 3), (1.0, 1.0))


# ---- no mutation -------------------------------------------------------------------------------


@pytest.mark.parametrize("op, kw, stride_in", [
    ("conv3d", dict(stride=2, padding=1), 1),
    ("subm_conv3d", {}, 1),
    ("conv_transpose3d", dict(stride=2), 2),
    ("generative_conv_transpose3d", dict(stride=2), 2),
])
@pytest.mark.parametrize("layout", ["dense", "kernel_major"])
def test_conv_never_mutates_coords_feats_weight_bias_or_grad(rng, op, kw, stride_in, layout):
    c = torch.from_numpy(random_coords(rng, 30))
    feats = torch.randn(c.shape[0], 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(*((4, 3, 3, 3, 3) if layout == "dense" else (27, 3, 4)), dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    saved = [t.detach().clone() for t in (c, feats, w, b)]
    xt = SparseTensor(c, feats, stride=stride_in)
    y = getattr(ops, op)(xt, w, b, kernel_size=3, **kw)
    dy = torch.randn(y.feats.shape, dtype=torch.float64)
    dy_saved = dy.clone()
    y.feats.backward(dy)
    for before, after in zip(saved, (c, feats, w, b)):
        assert torch.equal(before, after.detach())
    assert torch.equal(dy, dy_saved)
    assert torch.equal(xt.coords, saved[0])


def test_sparse_quantize_never_mutates_points_or_batch_indices(rng):
    p = torch.from_numpy(rng.standard_normal((50, 3)))
    b = torch.from_numpy(rng.integers(0, 3, 50))
    p0, b0 = p.clone(), b.clone()
    ops.sparse_quantize(p, (0.3, 0.2, 0.5), b, origin=(1.0, -1.0, 0.5))
    assert torch.equal(p, p0) and torch.equal(b, b0)
