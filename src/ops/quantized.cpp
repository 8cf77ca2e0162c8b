// Semantic layer of packed affine weights: validates a QuantizedWeight against the op, fills a
// QuantizedProblem, asks the route layer and runs the chosen route from the kernel table
// (dequant_reference: the whole weight dequantized, then the float conv route; fused_dequant_gemm
// (CPU) and cuda_dequant_gemm (CUDA): tiles decoded inside the GEMM loop). Features, weight
// arrays, bias and relation all live on one device.
#include "lattice/ops/quantized.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "backend/kernel_table.h"
#include "lattice/core/error.h"
#include "ops/common.h"

namespace lattice::ops {

std::string_view to_string(QuantizedLayout layout) {
  switch (layout) {
    case QuantizedLayout::linear: return "linear";
    case QuantizedLayout::kernel_major: return "kernel_major";
    case QuantizedLayout::dense_5d: return "dense_5d";
  }
  return "unknown";
}

namespace {

// A validated packed weight: the backend view plus contiguous copies it points into.
struct CheckedQuantized {
  Array packed, scales, biases;
  backend::QuantizedWeightArgs args;
};

std::string shape_str(const std::vector<std::int64_t>& s) { return format_shape(s); }

// Validates `w` for op `op` on features (N, c_in) of `device`; `kernel_volume` / `kernel_size`
// (convolutions) give the expected K. Errors name `weight`.
CheckedQuantized check_quantized(std::string_view op, const QuantizedWeight& w, std::int64_t c_in,
                                 const Device& device, bool is_linear, std::int64_t kernel_volume,
                                 const Int3& kernel_size) {
  if (w.bits != 4 && w.bits != 8) throw_value_error(op, "weight", "bits 4 or 8", std::to_string(w.bits));
  if (w.group_size != 32 && w.group_size != 64 && w.group_size != 128)
    throw_value_error(op, "weight", "group_size 32, 64 or 128", std::to_string(w.group_size));
  if (is_linear && w.layout != QuantizedLayout::linear)
    throw_value_error(op, "weight", "a QuantizedWeight with layout 'linear'",
                      "layout '" + std::string(to_string(w.layout)) + "'");
  if (!is_linear && w.layout == QuantizedLayout::linear)
    throw_value_error(op, "weight", "a QuantizedWeight with layout 'kernel_major' or 'dense_5d'",
                      "layout 'linear'");
  for (const Array* a : {&w.packed, &w.scales, &w.biases}) {
    if (!a->defined()) throw_value_error(op, "weight", "packed, scales and biases arrays", "a missing array");
    if (a->device() != device)
      throw_value_error(op, "weight", "a tensor on " + to_string(device), to_string(a->device()));
  }
  if (w.packed.dtype() != Dtype::i32 && w.packed.dtype() != Dtype::u32)
    throw_type_error(op, "weight", "packed words of int32 or uint32", to_string(w.packed.dtype()));
  const Dtype sd = w.scales.dtype();
  if (sd != Dtype::f16 && sd != Dtype::bf16 && sd != Dtype::f32)
    throw_type_error(op, "weight", "scales of float16, bfloat16 or float32", to_string(sd));
  if (w.biases.dtype() != sd)
    throw_type_error(op, "weight", "biases of the scales' dtype " + std::string(to_string(sd)),
                     to_string(w.biases.dtype()));
  const std::size_t ndim = w.layout == QuantizedLayout::linear ? 2 : w.layout == QuantizedLayout::kernel_major ? 3 : 5;
  if (w.shape.size() != ndim)
    throw_value_error(op, "weight", std::to_string(ndim) + " logical dims for layout '" +
                                        std::string(to_string(w.layout)) + "'",
                      shape_str(w.shape));
  for (auto d : w.shape)
    if (d <= 0) throw_value_error(op, "weight", "a positive logical shape", shape_str(w.shape));
  std::int64_t k = 1, w_c_in = 0, c_out = 0;
  if (w.layout == QuantizedLayout::linear) {
    c_out = w.shape[0];
    w_c_in = w.shape[1];
    if (w_c_in != c_in)
      throw_value_error(op, "weight", "logical shape (C_out, C_in=" + std::to_string(c_in) + ")", shape_str(w.shape));
  } else if (w.layout == QuantizedLayout::kernel_major) {
    k = w.shape[0];
    w_c_in = w.shape[1];
    c_out = w.shape[2];
    if (k != kernel_volume || w_c_in != c_in)
      throw_value_error(op, "weight", "logical shape (" + std::to_string(kernel_volume) + ", C_in=" +
                                          std::to_string(c_in) + ", C_out)",
                        shape_str(w.shape));
  } else {
    c_out = w.shape[0];
    w_c_in = w.shape[4];
    k = w.shape[1] * w.shape[2] * w.shape[3];
    if (w.shape[1] != kernel_size[0] || w.shape[2] != kernel_size[1] || w.shape[3] != kernel_size[2] ||
        w_c_in != c_in)
      throw_value_error(op, "weight", "logical shape (C_out, " + std::to_string(kernel_size[0]) + ", " +
                                          std::to_string(kernel_size[1]) + ", " + std::to_string(kernel_size[2]) +
                                          ", C_in=" + std::to_string(c_in) + ")",
                        shape_str(w.shape));
  }
  const std::int64_t per_word = 32 / w.bits;
  const std::int64_t pd = is_linear ? 2 : 3;
  if (w.packed.ndim() != pd)
    throw_value_error(op, "weight", "packed words with " + std::to_string(pd) + " dims",
                      format_shape(w.packed.shape()));
  const std::int64_t c_in_st = w.packed.dim(1) * per_word;
  if (c_in_st < c_in || c_in_st % w.group_size != 0)
    throw_value_error(op, "weight",
                      "storage channels (packed.shape[1]*32/bits) a multiple of group_size " +
                          std::to_string(w.group_size) + " and >= C_in=" + std::to_string(c_in),
                      std::to_string(c_in_st));
  const std::vector<std::int64_t> pshape =
      is_linear ? std::vector<std::int64_t>{c_out, c_in_st / per_word}
                : std::vector<std::int64_t>{k, c_in_st / per_word, c_out};
  const std::vector<std::int64_t> sshape =
      is_linear ? std::vector<std::int64_t>{c_out, c_in_st / w.group_size}
                : std::vector<std::int64_t>{k, c_in_st / w.group_size, c_out};
  auto same = [](const Shape& a, const std::vector<std::int64_t>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  };
  if (!same(w.packed.shape(), pshape))
    throw_value_error(op, "weight", "packed words of shape " + shape_str(pshape), format_shape(w.packed.shape()));
  if (!same(w.scales.shape(), sshape))
    throw_value_error(op, "weight", "scales of shape " + shape_str(sshape), format_shape(w.scales.shape()));
  if (!same(w.biases.shape(), sshape))
    throw_value_error(op, "weight", "biases of shape " + shape_str(sshape), format_shape(w.biases.shape()));
  CheckedQuantized out;
  out.packed = w.packed.contiguous();
  out.scales = w.scales.contiguous();
  out.biases = w.biases.contiguous();
  backend::QuantizedWeightArgs& a = out.args;
  a.packed = static_cast<const std::uint32_t*>(out.packed.raw_data());
  a.scales = out.scales.raw_data();
  a.biases = out.biases.raw_data();
  a.scale_dtype = sd;
  a.bits = w.bits;
  a.group_size = w.group_size;
  a.by_output = is_linear;
  a.kernel_volume = k;
  a.c_in = c_in;
  a.c_in_storage = c_in_st;
  a.c_out = c_out;
  return out;
}

void check_feats(std::string_view op, const Array& feats) {
  if (!feats.defined()) throw_value_error(op, "feats", "an (N, C_in) float array", "nothing");
  if (!is_floating(feats.dtype()))
    throw_type_error(op, "feats", "float16, bfloat16, float32 or float64", to_string(feats.dtype()));
  if (feats.ndim() != 2) throw_value_error(op, "feats", "an (N, C_in) array", format_shape(feats.shape()));
}

Array check_bias(std::string_view op, const Array* bias, const Array& feats, std::int64_t c_out) {
  if (!bias || !bias->defined()) return {};
  if (bias->dtype() != feats.dtype())
    throw_type_error(op, "bias", std::string(to_string(feats.dtype())) + " (the dtype of feats)",
                     to_string(bias->dtype()));
  if (bias->ndim() != 1 || bias->dim(0) != c_out)
    throw_value_error(op, "bias", "shape (C_out=" + std::to_string(c_out) + ",)", format_shape(bias->shape()));
  if (bias->device() != feats.device())
    throw_value_error(op, "bias", "the device of feats (" + to_string(feats.device()) + ")",
                      to_string(bias->device()));
  return bias->contiguous();
}

backend::RelationView identity_view(std::int64_t n) {
  backend::RelationView v;
  v.n_in = v.n_out = v.n_edges = n;
  v.kernel_volume = 1;
  v.identity = true;
  return v;
}

QuantizedProblem base_problem(std::string_view op, const Array& feats, const CheckedQuantized& w) {
  QuantizedProblem p;
  p.op = std::string(op);
  p.dtype = feats.dtype();
  p.scale_dtype = w.args.scale_dtype;
  p.device = feats.device();
  p.bits = w.args.bits;
  p.group_size = w.args.group_size;
  p.c_in = w.args.c_in;
  p.c_out = w.args.c_out;
  p.kernel_volume = w.args.kernel_volume;
  return p;
}

QuantizedProblem conv_problem(const ConvPlan& plan, const Array& feats, const CheckedQuantized& w) {
  QuantizedProblem p = base_problem(plan.op, feats, w);
  p.has_relation = true;
  p.relation = plan.kind;
  p.n_in = plan.relation->n_in;
  p.n_out = plan.relation->n_out;
  // Known from the geometry or an earlier pass, else -1 (no quantized route's admission reads
  // it; counting would read back on a device on every call): explain_quantized_conv counts.
  p.n_edges = plan.relation->known_edges();
  p.identity_relation = plan.relation->identity;
  return p;
}

// The routes that decode the whole weight to the activation dtype and then run the float route:
// dequant_reference (the oracle) and cuda_decode_conv (the CUDA default: the float route is the
// conv table's, tensor cores on sm_80+).
bool decodes_then_float_route(RouteId id) {
  return id == RouteId::quantized_dequant_reference || id == RouteId::quantized_cuda_decode_conv;
}

QuantizedProblem linear_problem(const Array& feats, const CheckedQuantized& w) {
  QuantizedProblem p = base_problem("linear", feats, w);
  p.n_in = p.n_out = p.n_edges = feats.dim(0);
  p.identity_relation = true;
  return p;
}

CheckedQuantized check_conv(const ConvPlan& plan, const Array& feats, const QuantizedWeight& weight) {
  check_feats(plan.op, feats);
  if (feats.dim(0) != plan.relation->n_in)
    throw_value_error(plan.op, "feats", "shape (N_in=" + std::to_string(plan.relation->n_in) + ", C_in)",
                      format_shape(feats.shape()));
  if (feats.device() != plan.input->coords().device())
    throw_value_error(plan.op, "feats", "the device of coords (" + to_string(plan.input->coords().device()) + ")",
                      to_string(feats.device()));
  return check_quantized(plan.op, weight, feats.dim(1), feats.device(), false, plan.spec.volume(), plan.spec.size);
}

RouteId choose(const QuantizedProblem& p, const RoutePolicy& policy) {
  return chosen_or_throw(explain(p, backend::device_caps(), effective_policy(policy, "quantized")));
}

const backend::QuantizedKernels& kernels_of(RouteId id) {
  const backend::QuantizedKernels* k = backend::find_quantized_kernels(id);
  LATTICE_ASSERT(k != nullptr, "admitted quantized route has no kernels in this build");
  return *k;
}

// The packed-weight decoder route (family dequantize) for a `dtype` weight on `device`, or null
// when no route is admitted (CUDA weights in a build without CUDA).
backend::DequantizeFn decoder(Dtype dtype, const Device& device) {
  DequantizeProblem problem;
  problem.dtype = dtype;
  problem.device = device;
  const std::optional<RouteId> route = select(problem, backend::device_caps());
  return route ? backend::find_dequantize_kernel(*route) : nullptr;
}

// The whole weight (K, C_in, C_out) of `dtype` on `device`, by the dequantize route.
Array dequantize_checked(const CheckedQuantized& w, Dtype dtype, const Device& device) {
  const backend::DequantizeFn dequantize = decoder(dtype, device);
  LATTICE_ASSERT(dequantize != nullptr, "no packed-weight decoder for this device in this build");
  Array out = Array::empty({w.args.kernel_volume, w.args.c_in, w.args.c_out}, dtype, device);
  backend::DequantizeArgs a;
  a.w = w.args;
  a.dtype = dtype;
  a.out = out.raw_data();
  a.device = device;
  dequantize(a);
  return out;
}

// An identity relation (edges (i, i, 0), K = 1) with every array on `device`, for the float
// device conv routes that read edge lists (linear's dequant_reference on CUDA data). Built on the
// host and copied: a reference path, O(n) once per call.
struct IdentityArrays {
  Array idx, zeros, out_ptr, k_ptr;
  backend::RelationView view;
};
IdentityArrays identity_on(std::int64_t n, const Device& device) {
  std::vector<std::int32_t> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::vector<std::int64_t> ptr(static_cast<std::size_t>(n + 1));
  std::iota(ptr.begin(), ptr.end(), std::int64_t{0});
  IdentityArrays a;
  a.idx = Array::from_vector<std::int32_t>(idx, {n}).to(device);
  a.zeros = Array::from_vector<std::int32_t>(std::vector<std::int32_t>(static_cast<std::size_t>(n), 0), {n}).to(device);
  a.out_ptr = Array::from_vector<std::int64_t>(ptr, {n + 1}).to(device);
  a.k_ptr = Array::from_vector<std::int64_t>({0, n}, {2}).to(device);
  backend::RelationView& v = a.view;
  v = identity_view(n);
  v.in_idx = v.out_idx = v.k_in = v.k_out = a.idx.data<std::int32_t>();
  v.k_idx = a.zeros.data<std::int32_t>();
  v.out_ptr = a.out_ptr.data<std::int64_t>();
  v.k_ptr = a.k_ptr.data<std::int64_t>();
  v.gemm_map = a.idx.data<std::int32_t>();  // (n, 1): row i reads row i
  return a;
}

}  // namespace

Array quantized_conv_forward(const ConvPlan& plan, const Array& feats, const QuantizedWeight& weight,
                             const Array* bias, const RoutePolicy& policy) {
  const CheckedQuantized w = check_conv(plan, feats, weight);
  const Array x = feats.contiguous();
  const Array b = check_bias(plan.op, bias, x, w.args.c_out);
  const RouteId id = choose(conv_problem(plan, x, w), policy);
  if (decodes_then_float_route(id)) {
    const Array full = dequantize_checked(w, x.dtype(), x.device());
    return conv_forward(plan, x, full, b.defined() ? &b : nullptr);
  }
  const backend::QuantizedKernels& k = kernels_of(id);
  Array y = Array::empty({plan.relation->n_out, w.args.c_out}, x.dtype(), x.device());
  backend::QuantizedConvArgs a;
  a.dtype = x.dtype();
  a.rel = relation_view(*plan.relation, kViewAll);  // packed-weight routes: every view
  a.w = w.args;
  a.x = x.raw_data();
  a.bias = b.defined() ? b.raw_data() : nullptr;
  a.y = y.raw_data();
  a.device = x.device();
  LATTICE_ASSERT(k.forward != nullptr, "quantized route has no forward kernel");
  k.forward(a);
  return y;
}

Explanation explain_quantized_conv(const ConvPlan& plan, const Array& feats, const QuantizedWeight& weight,
                                   const RoutePolicy& policy) {
  const CheckedQuantized w = check_conv(plan, feats, weight);
  QuantizedProblem p = conv_problem(plan, feats, w);
  p.n_edges = plan.relation->n_edges();  // for people, off the hot path (one read-back when uncounted)
  Explanation e = explain(p, backend::device_caps(), effective_policy(policy, "quantized"));
  // dequant_reference / cuda_decode_conv decode the weight, then run the float conv route this stage shows.
  if (e.chosen && decodes_then_float_route(*e.chosen))
    e.stages.push_back(explain_float_conv(plan, feats, w.args.c_out, ConvPass::forward));
  e.prior.push_back(explain_relation(plan));
  return e;
}

namespace {

// The float route dequant_reference runs for linear: the conv table over an identity relation of
// kernel volume 1 (CPU: pointwise_matmul; CUDA: a device route over an identity relation whose
// edge arrays live on the device).
Explanation explain_linear_float(const Array& x, const CheckedQuantized& w) {
  ConvProblem cp;
  cp.op = "linear";
  cp.relation = RelationKind::submanifold;
  cp.dtype = x.dtype();
  cp.device = x.device();
  cp.n_in = cp.n_out = cp.n_edges = x.dim(0);
  cp.c_in = w.args.c_in;
  cp.c_out = w.args.c_out;
  cp.kernel_volume = 1;
  cp.identity_relation = true;
  return explain(cp, backend::device_caps(), effective_policy({}, "conv"));
}

}  // namespace

Array quantized_linear(const Array& feats, const QuantizedWeight& weight, const Array* bias,
                       const RoutePolicy& policy) {
  check_feats("linear", feats);
  const CheckedQuantized w = check_quantized("linear", weight, feats.dim(1), feats.device(), true, 1, Int3{1, 1, 1});
  const Array x = feats.contiguous();
  const Array b = check_bias("linear", bias, x, w.args.c_out);
  const RouteId id = choose(linear_problem(x, w), policy);
  const std::int64_t n = x.dim(0);
  Array y = Array::empty({n, w.args.c_out}, x.dtype(), x.device());
  if (decodes_then_float_route(id)) {
    // The float route of a dense matmul: pointwise_matmul on (1, C_in, C_out) = W^T.
    const Array full = dequantize_checked(w, x.dtype(), x.device());
    const bool on_cpu = x.device().is_cpu();
    const RouteId fid = chosen_or_throw(explain_linear_float(x, w));
    const backend::ConvKernels* ck = backend::find_conv_kernels(fid);
    LATTICE_ASSERT(ck != nullptr, "admitted conv route has no kernels in this build");
    IdentityArrays ident;
    if (!on_cpu) ident = identity_on(n, x.device());
    backend::ConvArgs a;
    a.dtype = x.dtype();
    a.rel = on_cpu ? identity_view(n) : ident.view;
    a.device = x.device();
    a.c_in = w.args.c_in;
    a.c_out = w.args.c_out;
    a.x = x.raw_data();
    a.w = full.raw_data();
    a.bias = b.defined() ? b.raw_data() : nullptr;
    a.y = y.raw_data();
    ck->forward(a);
    return y;
  }
  const backend::QuantizedKernels& k = kernels_of(id);
  backend::QuantizedConvArgs a;
  a.dtype = x.dtype();
  a.rel = identity_view(n);
  a.w = w.args;
  a.x = x.raw_data();
  a.bias = b.defined() ? b.raw_data() : nullptr;
  a.y = y.raw_data();
  a.device = x.device();
  LATTICE_ASSERT(k.forward != nullptr, "quantized route has no forward kernel");
  k.forward(a);
  return y;
}

Explanation explain_quantized_linear(const Array& feats, const QuantizedWeight& weight, const RoutePolicy& policy) {
  check_feats("linear", feats);
  const CheckedQuantized w = check_quantized("linear", weight, feats.dim(1), feats.device(), true, 1, Int3{1, 1, 1});
  Explanation e = explain(linear_problem(feats, w), backend::device_caps(), effective_policy(policy, "quantized"));
  if (e.chosen && decodes_then_float_route(*e.chosen)) e.stages.push_back(explain_linear_float(feats, w));
  return e;
}

Array dequantize_kernel_major(std::string_view op, const QuantizedWeight& weight, Dtype dtype) {
  if (!is_floating(dtype)) throw_type_error(op, "dtype", "a float dtype", to_string(dtype));
  const bool is_linear = weight.layout == QuantizedLayout::linear;
  if (weight.shape.empty()) throw_value_error(op, "weight", "a logical shape", "()");
  const std::int64_t c_in = weight.layout == QuantizedLayout::kernel_major && weight.shape.size() == 3 ? weight.shape[1]
                                                                                                     : weight.shape.back();
  std::int64_t kv = 1;
  Int3 ks{1, 1, 1};
  if (weight.layout == QuantizedLayout::kernel_major) kv = weight.shape[0];
  if (weight.layout == QuantizedLayout::dense_5d && weight.shape.size() == 5) {
    ks = {static_cast<std::int32_t>(weight.shape[1]), static_cast<std::int32_t>(weight.shape[2]),
          static_cast<std::int32_t>(weight.shape[3])};
    kv = weight.shape[1] * weight.shape[2] * weight.shape[3];
  }
  if (!weight.packed.defined()) throw_value_error(op, "weight", "packed words", "nothing");
  if (decoder(dtype, weight.packed.device()) == nullptr)
    throw UnsupportedError("[" + std::string(op) + "] weight: expected a CPU weight (this build has no CUDA backend), got " +
                           to_string(weight.packed.device()));
  const CheckedQuantized w = check_quantized(op, weight, c_in, weight.packed.device(), is_linear, kv, ks);
  return dequantize_checked(w, dtype, weight.packed.device());
}

}  // namespace lattice::ops
