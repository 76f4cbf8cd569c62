// cynorm's norms as PyTorch operators with their autograd formulas in C++:
// layer norm and RMS norm, their residual-fused forms, batch norm, group
// norm and instance norm (with its own statistics), for cynorm.torch's
// eager calls that need gradients.  A Python
// torch.autograd.Function costs tens of microseconds a call, several times
// that where a model's large operators leave the caches cold; around their
// kernels these operators cost a few microseconds more than PyTorch's own
// norms.  cynorm/_torch_native.py compiles this file against the installed
// torch, loads it and binds it to the kernels (cynorm_native::bind, with
// the addresses of layer_norm.native_abi()'s and batch_norm.native_abi()'s
// tables).
//
// Each operator takes the plain case only (CPU tensors of cynorm's dtypes
// laid out as the kernels read them in place, parameters of the expected
// shape and of x's dtype or its math type, no empty reduction) and returns
// an undefined tensor (None in Python) for anything else: cynorm.torch then
// takes the call on its Python path, which computes or raises.  The results
// are the bits of that path: the same kernels, through cn_native_abi.h.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cfloat>
#include <cmath>
#include <vector>

#include "cn_native_abi.h"

namespace cynorm_native {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const cn_native_abi* kernels = nullptr;
const cn_native_channels_abi* channel_kernels = nullptr;

constexpr const char* kNoVmap =
    "cynorm.torch's operators do not support vmap: a batched tensor reached one "
    "(torch.func.vmap, jacrev, jacfwd or hessian, or torch.autograd.grad with "
    "is_grads_batched=True); compute the derivatives one at a time, or use PyTorch's norms "
    "there";

void bind(int64_t rows, int64_t channels) {
  auto r = reinterpret_cast<const cn_native_abi*>(static_cast<intptr_t>(rows));
  auto c = reinterpret_cast<const cn_native_channels_abi*>(static_cast<intptr_t>(channels));
  TORCH_CHECK(r != nullptr && r->version == CN_NATIVE_ABI_VERSION && c != nullptr &&
                  c->version == CN_NATIVE_ABI_VERSION,
              "cynorm_native.bind: the kernels' tables are not version ", CN_NATIVE_ABI_VERSION);
  kernels = r;
  channel_kernels = c;
}

// cynorm's storage code of a dtype, or -1
int storage_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return CN_NATIVE_F32;
    case at::kDouble: return CN_NATIVE_F64;
    case at::kBFloat16: return CN_NATIVE_BF16;
    case at::kHalf: return CN_NATIVE_F16;
    default: return -1;
  }
}

at::ScalarType math_dtype(int storage) {
  return storage == CN_NATIVE_F64 ? at::kDouble : at::kFloat;
}

at::ScalarType dtype_of(int storage) {
  switch (storage) {
    case CN_NATIVE_F64: return at::kDouble;
    case CN_NATIVE_BF16: return at::kBFloat16;
    case CN_NATIVE_F16: return at::kHalf;
    default: return at::kFloat;
  }
}

// a CPU tensor whose memory the kernels can read as it is (strides aside)
bool cpu_memory(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.has_storage() &&
         !t.is_neg() && !t.is_conj();
}

bool dense_cpu(const at::Tensor& t) { return cpu_memory(t) && t.is_contiguous(); }

// x as M rows of N (its last k axes), its shape ending in normalized_shape
struct Rows {
  int storage = -1;
  int64_t k = 0, M = 1, N = 1;
};

Rows rows_of(const at::Tensor& x, at::IntArrayRef normalized_shape) {
  Rows r;
  r.k = static_cast<int64_t>(normalized_shape.size());
  if (!dense_cpu(x) || r.k == 0 || r.k > x.dim()) return Rows{};
  r.storage = storage_of(x.scalar_type());
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < x.dim() - r.k) {
      r.M *= x.size(i);
    } else {
      if (x.size(i) != normalized_shape[i - (x.dim() - r.k)]) return Rows{};
      r.N *= x.size(i);
    }
  }
  if (r.M == 0 || r.N == 0) r.storage = -1;
  return r;
}

// an absent parameter, or one of the given shape and of x's storage or its
// math type
bool plain_param(const std::optional<at::Tensor>& p, int x_storage, at::IntArrayRef shape) {
  if (!p.has_value() || !p->defined()) return true;
  int s = storage_of(p->scalar_type());
  return dense_cpu(*p) && p->sizes() == shape &&
         (s == x_storage || s == storage_of(math_dtype(x_storage)));
}

const void* ptr(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }
void* mut(const at::Tensor& t) { return t.defined() ? t.mutable_data_ptr() : nullptr; }
int storage(const at::Tensor& t) { return t.defined() ? storage_of(t.scalar_type()) : -1; }

std::vector<int64_t> stat_shape(const at::Tensor& x, int64_t k) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end());
  for (int64_t i = x.dim() - k; i < x.dim(); ++i) s[i] = 1;
  return s;
}

// grad_out's rows where they lie: C order (no offsets), each row contiguous
// in another order (a batch_first attention's transposed gradient: the
// offset of each row, in elements), or copied into C order
struct DyRows {
  at::Tensor dy;
  std::vector<int64_t> offsets;
};

DyRows dy_rows(const at::Tensor& grad, const at::Tensor& x, int64_t k) {
  TORCH_CHECK(grad.has_storage(), kNoVmap);
  DyRows d{grad.scalar_type() == x.scalar_type() ? grad : grad.to(x.scalar_type()), {}};
  if (d.dy.is_contiguous()) return d;
  const int64_t nd = d.dy.dim(), lead = nd - k;
  bool rows = d.dy.sizes() == x.sizes() && d.dy.device().is_cpu() && !d.dy.is_neg() &&
              !d.dy.is_conj();
  int64_t step = 1;
  for (int64_t i = nd - 1; rows && i >= lead; --i) {
    if (d.dy.size(i) != 1 && d.dy.stride(i) != step) rows = false;
    step *= d.dy.size(i);
  }
  for (int64_t i = 0; rows && i < lead; ++i) rows = d.dy.stride(i) >= 0;
  if (!rows) {
    d.dy = d.dy.contiguous();
    return d;
  }
  int64_t m = 1;
  for (int64_t i = 0; i < lead; ++i) m *= d.dy.size(i);
  d.offsets.resize(static_cast<size_t>(m));
  std::vector<int64_t> idx(static_cast<size_t>(lead), 0);
  int64_t off = 0;
  for (int64_t r = 0; r < m; ++r) {
    d.offsets[static_cast<size_t>(r)] = off;
    for (int64_t j = lead - 1; j >= 0; --j) {  // the next index, the last axis fastest
      off += d.dy.stride(j);
      if (++idx[static_cast<size_t>(j)] < d.dy.size(j)) break;
      off -= d.dy.size(j) * d.dy.stride(j);
      idx[static_cast<size_t>(j)] = 0;
    }
  }
  return d;
}

// which of x, weight and bias need gradients (autograd's edges in that
// order, an absent parameter none)
struct Wanted {
  bool x, w, b;
};

Wanted wanted(AutogradContext* ctx, bool has_w, bool has_b) {
  size_t edge = 1;
  Wanted n{ctx->needs_input_grad(0), false, false};
  n.w = has_w && ctx->needs_input_grad(edge++);
  n.b = has_b && ctx->needs_input_grad(edge);
  return n;
}

void check_first_order(const char* op) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      !at::GradMode::is_enabled(), "cynorm.torch.", op,
      ": a derivative of a derivative (double backward, create_graph=True, nested torch.func "
      "transforms) is not supported: cynorm's backward and forward-mode rules are not "
      "differentiable themselves");
}

// The row norms' autograd formula: forward (layer norm centered, else RMS
// norm, bias absent) and backward over the kernels' table.  Inputs: x,
// weight, bias (the tensors: autograd's edges in that order, the absent
// ones skipped), then the rest.
struct RowNorm {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const Rows& r, double eps,
                            bool centered) {
    const at::Tensor w = weight.value_or(at::Tensor()), b = bias.value_or(at::Tensor());
    auto y = at::empty(x.sizes(), x.options());
    auto stats = x.options().dtype(math_dtype(r.storage));
    auto mean = centered ? at::empty(stat_shape(x, r.k), stats) : at::Tensor();
    auto rstd = at::empty(stat_shape(x, r.k), stats);
    int rc = kernels->rows_forward(r.storage, ptr(x), nullptr, ptr(w), storage(w), ptr(b),
                                   storage(b), mut(y), nullptr, mut(mean), mut(rstd), r.M, r.N,
                                   eps, centered);
    TORCH_CHECK(rc == 0, centered ? "layer_norm" : "rms_norm",
                ": could not allocate the parameters' math-type copies");
    ctx->save_for_backward({x, mean, rstd, w, b});
    ctx->saved_data["k"] = r.k;
    ctx->set_materialize_grads(false);
    return y;
  }

  // gradients of x, weight, bias (undefined where absent or not needed)
  static variable_list backward(AutogradContext* ctx, const at::Tensor& grad, bool centered) {
    check_first_order(centered ? "layer_norm" : "rms_norm");
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &mean = saved[1], &rstd = saved[2], &w = saved[3],
                     &b = saved[4];
    variable_list out(3);
    if (!grad.defined()) return out;
    const int64_t k = ctx->saved_data["k"].toInt();
    Rows r = rows_of(x, x.sizes().slice(static_cast<size_t>(x.dim() - k)));
    const Wanted need = wanted(ctx, w.defined(), b.defined());
    if (need.x) out[0] = at::empty(x.sizes(), x.options());
    if (need.w) out[1] = at::empty(w.sizes(), w.options());
    if (need.b) out[2] = at::empty(b.sizes(), b.options());
    DyRows dy = dy_rows(grad, x, k);
    int rc = kernels->rows_backward(
        r.storage, ptr(dy.dy), dy.offsets.empty() ? nullptr : dy.offsets.data(), nullptr,
        ptr(x), ptr(mean), ptr(rstd), ptr(w), storage(w), mut(out[0]), mut(out[1]),
        storage(out[1]), mut(out[2]), storage(out[2]), r.M, r.N);
    TORCH_CHECK(rc == 0, centered ? "layer_norm_backward" : "rms_norm_backward",
                ": could not allocate its workspace");
    return out;
  }
};

struct LayerNorm : public torch::autograd::Function<LayerNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, Rows r, double eps) {
    return RowNorm::forward(ctx, x, weight, bias, r, eps, true);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g = RowNorm::backward(ctx, grads[0], true);
    return {g[0], g[1], g[2], at::Tensor(), at::Tensor()};
  }
};

struct RMSNorm : public torch::autograd::Function<RMSNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight, Rows r, double eps) {
    return RowNorm::forward(ctx, x, weight, std::nullopt, r, eps, false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g = RowNorm::backward(ctx, grads[0], false);
    return {g[0], g[1], at::Tensor(), at::Tensor()};
  }
};

// The residual-fused forms: h = x + residual, y = norm(h); y and h both
// have gradients, and x and residual each take h's total gradient (y's
// backward plus h's own).  Inputs: x, residual, weight, bias, then the rest.
struct AddRowNorm {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& residual,
                               const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, const Rows& r, double eps,
                               bool centered) {
    const at::Tensor w = weight.value_or(at::Tensor()), b = bias.value_or(at::Tensor());
    auto y = at::empty(x.sizes(), x.options());
    auto h = at::empty(x.sizes(), x.options());
    auto stats = x.options().dtype(math_dtype(r.storage));
    auto mean = centered ? at::empty(stat_shape(x, r.k), stats) : at::Tensor();
    auto rstd = at::empty(stat_shape(x, r.k), stats);
    int rc = kernels->rows_forward(r.storage, ptr(x), ptr(residual), ptr(w), storage(w), ptr(b),
                                   storage(b), mut(y), mut(h), mut(mean), mut(rstd), r.M, r.N,
                                   eps, centered);
    TORCH_CHECK(rc == 0, centered ? "add_layer_norm" : "add_rms_norm",
                ": could not allocate the parameters' math-type copies");
    // the backward reads h (not x and residual, which it does not keep alive)
    ctx->save_for_backward({h, mean, rstd, w, b});
    ctx->saved_data["k"] = r.k;
    ctx->set_materialize_grads(false);
    // h, as x + residual, has a gradient only where one of them does
    if (!ctx->needs_input_grad(0) && !ctx->needs_input_grad(1)) ctx->mark_non_differentiable({h});
    return {y, h};
  }

  // gradients of x, residual, weight, bias
  static variable_list backward(AutogradContext* ctx, const at::Tensor& gy, const at::Tensor& gh,
                                bool centered) {
    check_first_order(centered ? "add_layer_norm" : "add_rms_norm");
    auto saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &mean = saved[1], &rstd = saved[2], &w = saved[3],
                     &b = saved[4];
    variable_list out(4);
    if (!gy.defined() && !gh.defined()) return out;
    const int64_t k = ctx->saved_data["k"].toInt();
    Rows r = rows_of(h, h.sizes().slice(static_cast<size_t>(h.dim() - k)));
    size_t edge = 2;
    bool need_x = ctx->needs_input_grad(0), need_res = ctx->needs_input_grad(1);
    // (y not used further: no parameter gradients, as the unfused composition)
    bool need_w = w.defined() && ctx->needs_input_grad(edge++) && gy.defined();
    bool need_b = b.defined() && ctx->needs_input_grad(edge) && gy.defined();
    at::Tensor gi = (need_x || need_res) ? at::empty(h.sizes(), h.options()) : at::Tensor();
    if (need_w) out[2] = at::empty(w.sizes(), w.options());
    if (need_b) out[3] = at::empty(b.sizes(), b.options());
    // y's gradient where only h's came back: zeros, which the kernels take
    DyRows dy = dy_rows(gy.defined() ? gy : at::zeros_like(gh), h, k);
    TORCH_CHECK(!gh.defined() || gh.has_storage(), kNoVmap);
    at::Tensor dh = gh.defined() ? gh.to(h.scalar_type()).contiguous() : at::Tensor();
    int rc = kernels->rows_backward(
        r.storage, ptr(dy.dy), dy.offsets.empty() ? nullptr : dy.offsets.data(), ptr(dh),
        ptr(h), ptr(mean), ptr(rstd), ptr(w), storage(w), mut(gi), mut(out[2]),
        storage(out[2]), mut(out[3]), storage(out[3]), r.M, r.N);
    TORCH_CHECK(rc == 0, centered ? "add_layer_norm_backward" : "add_rms_norm_backward",
                ": could not allocate its workspace");
    if (need_x) out[0] = gi;
    if (need_res) out[1] = gi;
    return out;
  }
};

struct AddLayerNorm : public torch::autograd::Function<AddLayerNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& residual,
                               const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, Rows r, double eps) {
    return AddRowNorm::forward(ctx, x, residual, weight, bias, r, eps, true);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g = AddRowNorm::backward(ctx, grads[0], grads[1], true);
    return {g[0], g[1], g[2], g[3], at::Tensor(), at::Tensor()};
  }
};

struct AddRMSNorm : public torch::autograd::Function<AddRMSNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& residual,
                               const std::optional<at::Tensor>& weight, Rows r, double eps) {
    return AddRowNorm::forward(ctx, x, residual, weight, std::nullopt, r, eps, false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g = AddRowNorm::backward(ctx, grads[0], grads[1], false);
    return {g[0], g[1], g[2], at::Tensor(), at::Tensor()};
  }
};

// the math type's epsilon where none is given, as cynorm.rms_norm and torch take it
double rms_eps(std::optional<double> eps, const Rows& r) {
  return eps.has_value() ? *eps : (r.storage == CN_NATIVE_F64 ? DBL_EPSILON : FLT_EPSILON);
}

// a residual of x's shape and dtype, dense on the CPU
bool plain_residual(const at::Tensor& residual, const at::Tensor& x) {
  return dense_cpu(residual) && residual.sizes() == x.sizes() &&
         residual.scalar_type() == x.scalar_type();
}

using Pair = std::tuple<at::Tensor, at::Tensor>;

Pair add_layer_norm(const at::Tensor& x, const at::Tensor& residual,
                    at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                    const std::optional<at::Tensor>& bias, double eps) {
  Rows r = rows_of(x, normalized_shape);
  if (kernels == nullptr || r.storage < 0 || !plain_residual(residual, x) ||
      !plain_param(weight, r.storage, normalized_shape) ||
      !plain_param(bias, r.storage, normalized_shape))
    return {};
  auto out = AddLayerNorm::apply(x, residual, weight, bias, r, eps);
  return {out[0], out[1]};
}

Pair add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                  at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                  std::optional<double> eps) {
  Rows r = rows_of(x, normalized_shape);
  if (kernels == nullptr || r.storage < 0 || !plain_residual(residual, x) ||
      !plain_param(weight, r.storage, normalized_shape))
    return {};
  auto out = AddRMSNorm::apply(x, residual, weight, r, rms_eps(eps, r));
  return {out[0], out[1]};
}

at::Tensor layer_norm(const at::Tensor& x, at::IntArrayRef normalized_shape,
                      const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, double eps) {
  Rows r = rows_of(x, normalized_shape);
  if (kernels == nullptr || r.storage < 0 || !plain_param(weight, r.storage, normalized_shape) ||
      !plain_param(bias, r.storage, normalized_shape))
    return at::Tensor();
  return LayerNorm::apply(x, weight, bias, r, eps);
}

at::Tensor rms_norm(const at::Tensor& x, at::IntArrayRef normalized_shape,
                    const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  Rows r = rows_of(x, normalized_shape);
  if (kernels == nullptr || r.storage < 0 || !plain_param(weight, r.storage, normalized_shape))
    return at::Tensor();
  return RMSNorm::apply(x, weight, r, rms_eps(eps, r));
}

// ---- batch norm ----------------------------------------------------------

// (N, *spatial, C) memory with the channels on axis 1, as cynorm's plain
// case tells a channels-last view (an axis of length 1 other than the
// channels' with any stride)
bool channels_last_memory(const at::Tensor& x) {
  if (x.dim() < 3 || x.stride(1) != 1) return false;
  int64_t step = x.size(1);
  for (int64_t i = x.dim() - 1; i >= 2; --i) {
    if (x.size(i) != 1 && x.stride(i) != step) return false;
    step *= x.size(i);
  }
  return x.size(0) == 1 || x.stride(0) == step;
}

// x as (A, C, B) where the kernels read it in place, as cynorm's plain case
// reads a tensor's NumPy view: C-contiguous (A = N, B the spatial size), or
// stored channels last ((N, *spatial, C) memory: A = N * spatial, B = 1)
// with no axis of length 1 (whose stride leaves the order open)
struct Channels {
  int storage = -1;
  int64_t A = 0, C = 0, B = 0;
};

// no axis of length 1 (batch norm's plain case reads channels last only so)
bool no_unit_axis(const at::Tensor& x) {
  for (int64_t i = 0; i < x.dim(); ++i)
    if (x.size(i) < 2) return false;
  return true;
}

Channels channels_of(const at::Tensor& x) {
  Channels ch;
  if (!cpu_memory(x) || x.dim() < 2)
    return ch;
  int64_t spatial = 1;
  for (int64_t i = 2; i < x.dim(); ++i) spatial *= x.size(i);
  ch.C = x.size(1);
  if (x.is_contiguous()) {
    ch.A = x.size(0);
    ch.B = spatial;
  } else if (no_unit_axis(x) && channels_last_memory(x)) {
    ch.A = x.size(0) * spatial;
    ch.B = 1;
  } else {
    return ch;
  }
  ch.storage = storage_of(x.scalar_type());
  return ch;
}

// Inputs: x, weight, bias, running_mean, running_var (the tensors: autograd's
// edges in that order, the absent ones skipped), then the rest.  Training
// updates the running statistics in place, as PyTorch's batch norm does.
struct BatchNorm : public torch::autograd::Function<BatchNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias,
                            const std::optional<at::Tensor>& running_mean,
                            const std::optional<at::Tensor>& running_var, Channels ch,
                            bool training, double momentum, double eps) {
    const at::Tensor w = weight.value_or(at::Tensor()), b = bias.value_or(at::Tensor());
    const at::Tensor rm = running_mean.value_or(at::Tensor());
    const at::Tensor rv = running_var.value_or(at::Tensor());
    auto y = at::empty_like(x);  // x's layout
    auto stats = x.options().dtype(math_dtype(ch.storage));
    auto save_mean = at::empty({training ? ch.C : 0}, stats);
    auto save_invstd = at::empty({training ? ch.C : 0}, stats);
    // (read only in inference)
    void* prm = training ? mut(rm) : const_cast<void*>(ptr(rm));
    void* prv = training ? mut(rv) : const_cast<void*>(ptr(rv));
    int rc = channel_kernels->channels_forward(
        ch.storage, ptr(x), mut(y), ptr(w), storage(w), ptr(b), storage(b), prm, storage(rm),
        prv, storage(rv), training ? mut(save_mean) : nullptr,
        training ? mut(save_invstd) : nullptr, ch.A, ch.C, ch.B, training, momentum, eps);
    TORCH_CHECK(rc == 0, "batch_norm: could not allocate its workspace");
    if (training) {
      // an in-place update, as autograd counts them
      for (const at::Tensor* s : {&rm, &rv})
        if (s->defined()) torch::autograd::impl::bump_version(*s);
      ctx->save_for_backward({x, w, save_mean, save_invstd});
    } else {
      // the running statistics as this call used them (a later call may
      // update the module's buffers)
      ctx->save_for_backward({x, w, rm.clone(), rv.clone()});
    }
    ctx->saved_data["training"] = training;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["bias"] = b.defined();
    ctx->set_materialize_grads(false);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_first_order("batch_norm");
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &first = saved[2], &second = saved[3];
    variable_list out(9);
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) return out;
    const bool training = ctx->saved_data["training"].toBool();
    const Wanted need = wanted(ctx, w.defined(), ctx->saved_data["bias"].toBool());
    TORCH_CHECK(grad.has_storage(), kNoVmap);
    at::Tensor dy = grad.scalar_type() == x.scalar_type() ? grad : grad.to(x.scalar_type());
    // x is C-contiguous or stored channels last (channels_of); grad_out in
    // another layout is read in x's if that is C order, else both are, as
    // cynorm's Python layer reads them (grad_x then copied into x's layout)
    const bool last = !x.is_contiguous();
    const bool dy_last = no_unit_axis(dy) && channels_last_memory(dy);
    const at::Tensor xs = last && !dy_last ? x.contiguous() : x;
    if (!dy.is_contiguous() && !(last && xs.is_same(x))) dy = dy.contiguous();
    const Channels ch = channels_of(xs);
    const int gs = w.defined() ? storage(w) : storage_of(math_dtype(ch.storage));
    auto gopt = x.options().dtype(dtype_of(gs));
    at::Tensor gx = need.x ? at::empty_like(xs) : at::Tensor();
    if (need.w) out[1] = at::empty({ch.C}, gopt);
    if (need.b) out[2] = at::empty({ch.C}, gopt);
    int rc = channel_kernels->channels_backward(
        ch.storage, ptr(dy), ptr(xs), mut(gx), ptr(w), storage(w), ptr(first), storage(first),
        ptr(second), storage(second), mut(out[1]), gs, mut(out[2]), gs, ch.A, ch.C, ch.B,
        training, ctx->saved_data["eps"].toDouble());
    TORCH_CHECK(rc == 0, "batch_norm_backward: could not allocate its workspace");
    // grad_x laid out as x
    out[0] = !need.x || xs.is_same(x) ? gx : at::empty_like(x).copy_(gx);
    return out;
  }
};

// a running statistic the kernels update in place: overlapping none of the
// other arguments
bool apart(const std::optional<at::Tensor>& s, std::initializer_list<const at::Tensor*> others) {
  if (!s.has_value() || !s->defined()) return true;
  for (const at::Tensor* o : others)
    if (o->defined() && s->is_alias_of(*o)) return false;
  return true;
}

at::Tensor batch_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias,
                      const std::optional<at::Tensor>& running_mean,
                      const std::optional<at::Tensor>& running_var, bool training,
                      double momentum, double eps) {
  Channels ch = channels_of(x);
  // (no values per channel, or one in training, and eps 0 in training: the
  // Python path, which raises or takes them)
  if (channel_kernels == nullptr || ch.storage < 0 || ch.C == 0 || ch.A * ch.B == 0 ||
      !std::isfinite(momentum) || !(eps >= 0.0) ||
      (training && (ch.A * ch.B == 1 || eps == 0.0)))
    return at::Tensor();
  const std::vector<int64_t> shape{ch.C};
  for (const auto* p : {&weight, &bias, &running_mean, &running_var})
    if (!plain_param(*p, ch.storage, shape)) return at::Tensor();
  const at::Tensor w = weight.value_or(at::Tensor()), b = bias.value_or(at::Tensor());
  const at::Tensor rm = running_mean.value_or(at::Tensor());
  const at::Tensor rv = running_var.value_or(at::Tensor());
  if (training ? !(apart(running_mean, {&x, &w, &b, &rv}) && apart(running_var, {&x, &w, &b}))
               : !(rm.defined() && rv.defined()))
    return at::Tensor();
  return BatchNorm::apply(x, weight, bias, running_mean, running_var, ch, training, momentum,
                          eps);
}

// ---- group norm and instance norm ----------------------------------------

// x as the kernels read it in place, as cynorm's plain case reads a
// tensor's NumPy view: (N, C, HW) C-contiguous, or (N, HW, C) (last): an
// (N, C) tensor, or one stored channels last ((N, *spatial, C) memory, an
// axis of length 1 other than the channels' with any stride)
struct Groups {
  int storage = -1;
  int64_t N = 0, C = 0, HW = 0;
  bool last = false;
};

Groups groups_of(const at::Tensor& x) {
  Groups g;
  if (!cpu_memory(x) || x.dim() < 2)
    return g;
  g.N = x.size(0);
  g.C = x.size(1);
  g.HW = 1;
  for (int64_t i = 2; i < x.dim(); ++i) g.HW *= x.size(i);
  if (g.N * g.C * g.HW == 0) return g;
  if (x.is_contiguous()) {
    g.last = x.dim() == 2;
  } else if (channels_last_memory(x)) {
    g.last = true;
  } else {
    return g;
  }
  g.storage = storage_of(x.scalar_type());
  return g;
}

// The autograd formula of group norm over G groups (instance norm: G = C,
// y contiguous, as PyTorch's instance norm returns it).  Inputs: x, weight,
// bias (the tensors: autograd's edges in that order, the absent ones
// skipped), then the rest.
struct Groupwise {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const Groups& g, int64_t G,
                            double eps, bool dense) {
    const at::Tensor w = weight.value_or(at::Tensor()), b = bias.value_or(at::Tensor());
    auto y = at::empty_like(x);  // x's layout, which the kernels write
    auto stats = x.options().dtype(math_dtype(g.storage));
    auto mean = at::empty({g.N, G}, stats), rstd = at::empty({g.N, G}, stats);
    int rc = channel_kernels->groups_forward(g.storage, ptr(x), mut(y), ptr(w), storage(w),
                                             ptr(b), storage(b), mut(mean), mut(rstd), g.N, g.C,
                                             g.HW, G, eps, g.last);
    TORCH_CHECK(rc == 0, dense ? "instance_norm" : "group_norm",
                ": could not allocate its workspace");
    ctx->save_for_backward({x, mean, rstd, w});
    ctx->saved_data["groups"] = G;
    ctx->saved_data["bias"] = b.defined();
    ctx->set_materialize_grads(false);
    return dense && !y.is_contiguous() ? y.contiguous() : y;
  }

  // gradients of x, weight, bias
  static variable_list backward(AutogradContext* ctx, const at::Tensor& grad, bool instance) {
    check_first_order(instance ? "instance_norm" : "group_norm");
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &mean = saved[1], &rstd = saved[2], &w = saved[3];
    variable_list out(3);
    if (!grad.defined()) return out;
    const Wanted need = wanted(ctx, w.defined(), ctx->saved_data["bias"].toBool());
    TORCH_CHECK(grad.has_storage(), kNoVmap);
    at::Tensor dy = grad.scalar_type() == x.scalar_type() ? grad : grad.to(x.scalar_type());
    const Groups g = groups_of(x);
    // grad_out in another layout than x's: copied into x's, as cynorm's
    // Python layer reads it
    if (g.last && x.dim() > 2 ? !channels_last_memory(dy) : !dy.is_contiguous())
      dy = g.last && x.dim() > 2 ? at::empty_like(x).copy_(dy) : dy.contiguous();
    // the parameters' gradients in weight's dtype (x's without one)
    auto popt = x.options().dtype(w.defined() ? w.scalar_type() : x.scalar_type());
    if (need.x) out[0] = at::empty_like(x);
    if (need.w) out[1] = at::empty({g.C}, popt);
    if (need.b) out[2] = at::empty({g.C}, popt);
    int rc = channel_kernels->groups_backward(
        g.storage, ptr(dy), ptr(x), mut(out[0]), ptr(mean), ptr(rstd), ptr(w), storage(w),
        mut(out[1]), storage(out[1]), mut(out[2]), storage(out[2]), g.N, g.C, g.HW,
        ctx->saved_data["groups"].toInt(), g.last, false);
    TORCH_CHECK(rc == 0, instance ? "instance_norm_backward" : "group_norm_backward",
                ": could not allocate its workspace");
    return out;
  }
};

struct GroupNorm : public torch::autograd::Function<GroupNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, Groups g, int64_t G,
                            double eps) {
    return Groupwise::forward(ctx, x, weight, bias, g, G, eps, false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto gr = Groupwise::backward(ctx, grads[0], false);
    return {gr[0], gr[1], gr[2], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct InstanceNorm : public torch::autograd::Function<InstanceNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, Groups g, double eps) {
    return Groupwise::forward(ctx, x, weight, bias, g, g.C, eps, true);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto gr = Groupwise::backward(ctx, grads[0], true);
    return {gr[0], gr[1], gr[2], at::Tensor(), at::Tensor()};
  }
};

at::Tensor group_norm(const at::Tensor& x, int64_t num_groups,
                      const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, double eps) {
  Groups g = groups_of(x);
  const std::vector<int64_t> shape{g.C};
  if (channel_kernels == nullptr || g.storage < 0 || num_groups < 1 || g.C % num_groups != 0 ||
      !(eps >= 0.0) || !plain_param(weight, g.storage, shape) ||
      !plain_param(bias, g.storage, shape))
    return at::Tensor();
  return GroupNorm::apply(x, weight, bias, g, num_groups, eps);
}

// with its own statistics and no running ones (the rest: the Python path)
at::Tensor instance_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& running_mean,
                         const std::optional<at::Tensor>& running_var, bool use_input_stats,
                         double momentum, double eps) {
  (void)momentum;
  Groups g = groups_of(x);
  const std::vector<int64_t> shape{g.C};
  if (channel_kernels == nullptr || g.storage < 0 || x.dim() < 3 || !use_input_stats ||
      (running_mean.has_value() && running_mean->defined()) ||
      (running_var.has_value() && running_var->defined()) || !(eps >= 0.0) ||
      !plain_param(weight, g.storage, shape) || !plain_param(bias, g.storage, shape))
    return at::Tensor();
  return InstanceNorm::apply(x, weight, bias, g, eps);
}

}  // namespace cynorm_native

TORCH_LIBRARY(cynorm_native, m) {
  m.def("bind(int rows, int channels) -> ()", &cynorm_native::bind);
  m.def("layer_norm(Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, "
        "float eps) -> Tensor");
  m.def("rms_norm(Tensor x, int[] normalized_shape, Tensor? weight, float? eps) -> Tensor");
  m.def("add_layer_norm(Tensor x, Tensor residual, int[] normalized_shape, Tensor? weight, "
        "Tensor? bias, float eps) -> (Tensor, Tensor)");
  m.def("add_rms_norm(Tensor x, Tensor residual, int[] normalized_shape, Tensor? weight, "
        "float? eps) -> (Tensor, Tensor)");
  m.def("batch_norm(Tensor x, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
        "Tensor(b!)? running_var, bool training, float momentum, float eps) -> Tensor");
  m.def("group_norm(Tensor x, int num_groups, Tensor? weight, Tensor? bias, float eps) "
        "-> Tensor");
  m.def("instance_norm(Tensor x, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
        "Tensor(b!)? running_var, bool use_input_stats, float momentum, float eps) -> Tensor");
}

// CompositeImplicitAutograd: the operators carry their own autograd
// formula (the Functions above) and run the kernels on the tensors' memory
TORCH_LIBRARY_IMPL(cynorm_native, CompositeImplicitAutograd, m) {
  m.impl("layer_norm", &cynorm_native::layer_norm);
  m.impl("rms_norm", &cynorm_native::rms_norm);
  m.impl("add_layer_norm", &cynorm_native::add_layer_norm);
  m.impl("add_rms_norm", &cynorm_native::add_rms_norm);
  m.impl("batch_norm", &cynorm_native::batch_norm);
  m.impl("group_norm", &cynorm_native::group_norm);
  m.impl("instance_norm", &cynorm_native::instance_norm);
}
