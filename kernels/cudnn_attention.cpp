// cuDNN fused causal attention (kernels/cudnn_attention.h): run-time loading, graph construction
// with the cuDNN 9 backend API, plan cache, execution.
//
// The graphs are the ones NVIDIA cudnn-frontend builds for its composite SDPA nodes (MHA without
// dropout, bias or ragged layouts), written directly with backend descriptors on (B, NH, T, hs)
// strided views of the interleaved buffers. Tensor and compute types, the -inf mask fill, the
// Stats output (= our lse), the backward's extra buffers carved from the caller's workspace, the
// cuDNN <= 9.15 padding-mask workaround and the operation order each follow a frontend choice.
// Plans: heuristics mode A, then FALLBACK; the first engine config whose plan finalizes wins.
// Requires libcudnn.so.9 >= 9.10.2 (checked; everything is resolved from that shim, which loads
// the engine libraries itself) and Hopper (sm_90) or Ampere (sm_80) for the fused engines.
// Every choice and where it comes from, and the library layout: docs/cuda.md,
// "kernels/cudnn_attention.cpp".
#if defined(TF_WITH_CUDA)
#include "kernels/cudnn_attention.h"
#include "base/dynlib.h"

#if __has_include(<cudnn_graph.h>)
#define TF_HAVE_CUDNN_HEADERS 1
#endif


#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#if defined(TF_HAVE_CUDNN_HEADERS)
#include <cudnn_graph.h>
#endif

namespace tf::cuda {

#if !defined(TF_HAVE_CUDNN_HEADERS)
// Built without cuDNN headers: every entry point says so.
struct CudnnAttention::Plan {};
static Status NoHeaders() {
  return Status::Unimplemented("this build has no cuDNN headers (cudnn_graph.h); cuDNN attention is unavailable");
}
Status CudnnLibraryStatus() { return NoHeaders(); }
std::string CudnnLibraryDescription() { return "not available: built without cuDNN headers"; }
Status ProbeCudnnLibrary(const std::string&) { return NoHeaders(); }
StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(CudnnAttentionOptions) { return NoHeaders(); }
CudnnAttention::~CudnnAttention() = default;
StatusOr<size_t> CudnnAttention::WorkspaceBytes(Direction, int, int, int, int) { return NoHeaders(); }
Status CudnnAttention::Forward(void*, float*, const void*, int, int, int, int, DType, void*, size_t, cudaStream_t) {
  return NoHeaders();
}
Status CudnnAttention::Backward(void*, const void*, const void*, const void*, const float*, int, int, int, int, DType,
                                void*, size_t, cudaStream_t) {
  return NoHeaders();
}
std::string CudnnAttention::Describe() const { return "cuDNN unavailable (no headers at build time)"; }
Status CudnnAttention::CheckGraphOnHost(Direction, int, int, int, int, CudnnAttentionOptions, int64_t) {
  return NoHeaders();
}
StatusOr<CudnnAttention::DescribedDevicePlan> CudnnAttention::PlanOnDescribedDevice(Direction, int, int, int, int,
                                                                                     const std::string&,
                                                                                     CudnnAttentionOptions) {
  return NoHeaders();
}
StatusOr<CudnnAttention::Plan*> CudnnAttention::GetPlan(Direction, int, int, int, int) { return NoHeaders(); }
#else

namespace {

constexpr int64_t kMinVersion = 91002;  // 9.10.2: see the header comment above

// ---------------------------------------------------------------------------------------------------
// Run-time loading.

// The cuDNN entry points used, resolved from libcudnn.so.9.
struct Cudnn {
  decltype(&cudnnGetVersion) GetVersion = nullptr;
  decltype(&cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&cudnnGetLastErrorString) GetLastErrorString = nullptr;
  decltype(&cudnnCreate) Create = nullptr;
  decltype(&cudnnDestroy) Destroy = nullptr;
  decltype(&cudnnSetStream) SetStream = nullptr;
  decltype(&cudnnBackendCreateDescriptor) CreateDescriptor = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) DestroyDescriptor = nullptr;
  decltype(&cudnnBackendSetAttribute) SetAttribute = nullptr;
  decltype(&cudnnBackendGetAttribute) GetAttribute = nullptr;
  decltype(&cudnnBackendFinalize) Finalize = nullptr;
  decltype(&cudnnBackendExecute) Execute = nullptr;
  int64_t version = 0;
  std::string path;   // what was loaded
  std::string error;  // why loading failed ("" when loaded)
  bool ok() const { return error.empty(); }
};

// Resolves the symbols of a loaded library into *c and checks the version.
Status ResolveCudnn(const DynamicLibrary& lib, Cudnn* c) {
  TF_RETURN_IF_ERROR(lib.Resolve(&c->GetVersion, "cudnnGetVersion"));
  TF_RETURN_IF_ERROR(lib.Resolve(&c->GetErrorString, "cudnnGetErrorString"));
  TF_RETURN_IF_ERROR(lib.Resolve(&c->GetLastErrorString, "cudnnGetLastErrorString"));
  TF_RETURN_IF_ERROR(lib.Resolve(&c->Create, "cudnnCreate"));
  TF_RETURN_IF_ERROR(lib.Resolve(&c->Destroy, "cudnnDestroy"));
  TF_RETURN_IF_ERROR(lib.Resolve(&c->SetStream, "cudnnSetStream"));
  TF_RETURN_IF_ERROR(lib.Resolve(&c->CreateDescriptor, "cudnnBackendCreateDescriptor"));
  TF_RETURN_IF_ERROR(lib.Resolve(&c->DestroyDescriptor, "cudnnBackendDestroyDescriptor"));
  TF_RETURN_IF_ERROR(lib.Resolve(&c->SetAttribute, "cudnnBackendSetAttribute"));
  TF_RETURN_IF_ERROR(lib.Resolve(&c->GetAttribute, "cudnnBackendGetAttribute"));
  TF_RETURN_IF_ERROR(lib.Resolve(&c->Finalize, "cudnnBackendFinalize"));
  TF_RETURN_IF_ERROR(lib.Resolve(&c->Execute, "cudnnBackendExecute"));
  c->version = static_cast<int64_t>(c->GetVersion());
  if (c->version < kMinVersion || c->version >= 100000) {
    return Status::NotFound("cuDNN {}; cuDNN attention needs 9.x >= {}", c->version, kMinVersion);
  }
  c->path = lib.path();
  return Status::OK();
}

// TRAINFLOW_CUDNN_LIBRARY alone when set; else base/dynlib.h's usual places for NVIDIA libraries.
LibrarySearch CudnnSearch() {
  return LibrarySearch{.name = "libcudnn.so.9",
                       .override_env = "TRAINFLOW_CUDNN_LIBRARY",
                       .candidates = NvidiaLibraryCandidates("libcudnn.so.9", "CUDNN_HOME", "cudnn"),
                       .hint = "install cuDNN >= 9.10.2, put its lib directory on LD_LIBRARY_PATH or set "
                               "TRAINFLOW_CUDNN_LIBRARY"};
}

const Cudnn& LoadCudnn() {
  static const Cudnn* cudnn = [] {
    auto* c = new Cudnn();
    auto lib = LoadLibrary(CudnnSearch(), [c](const DynamicLibrary& l) {
      *c = Cudnn();
      return ResolveCudnn(l, c);
    });
    if (!lib.ok()) {
      *c = Cudnn();
      c->error = lib.status().message();
    } else {
      new DynamicLibrary(std::move(lib).value());  // stays open for the process lifetime
    }
    return c;
  }();
  return *cudnn;
}

Status CudnnError(const Cudnn& api, cudnnStatus_t st, const std::string& what) {
  std::string detail;
  if (api.GetLastErrorString != nullptr) {
    char buf[2048] = {0};
    api.GetLastErrorString(buf, sizeof(buf));
    if (buf[0] != '\0') detail = std::string(": ") + buf;
  }
  const char* name = api.GetErrorString != nullptr ? api.GetErrorString(st) : "?";
  return Status::Internal("cuDNN {}: {} ({}){}", what, name, static_cast<int>(st), detail);
}

// ---------------------------------------------------------------------------------------------------
// Backend descriptors.

// Owns one backend descriptor.
class Desc {
 public:
  Desc() = default;
  Desc(const Cudnn* api, cudnnBackendDescriptor_t d) : api_(api), d_(d) {}
  ~Desc() { Reset(); }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc(Desc&& o) noexcept : api_(o.api_), d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    if (this != &o) {
      Reset();
      api_ = o.api_;
      d_ = o.d_;
      o.d_ = nullptr;
    }
    return *this;
  }
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  void Reset() {
    if (d_ != nullptr) api_->DestroyDescriptor(d_);
    d_ = nullptr;
  }
  const Cudnn* api_ = nullptr;
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::array<int64_t, 4>;
using TensorDesc = cudnnBackendDescriptor_t;  // borrowed from the builder, which owns it

// Builds descriptors, keeping the first error: after a failure every call is a no-op returning
// nullptr, and status() says what failed (descriptor, attribute, cuDNN's message).
class GraphBuilder {
 public:
  explicit GraphBuilder(const Cudnn& api) : api_(api) {}

  const Status& status() const { return status_; }
  const std::vector<cudnnBackendDescriptor_t>& ops() const { return op_ptrs_; }

  // A tensor; `uid` unique in the graph.
  TensorDesc Tensor(const char* name, int64_t uid, cudnnDataType_t dt, const Dims& dims, const Dims& strides,
                    bool is_virtual, bool by_value = false) {
    cudnnBackendDescriptor_t d = Make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, name);
    const int64_t alignment = 16;
    const bool virt = is_virtual;
    Set(d, name, "UNIQUE_ID", CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    Set(d, name, "DATA_TYPE", CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    Set(d, name, "DIMENSIONS", CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    Set(d, name, "STRIDES", CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    Set(d, name, "BYTE_ALIGNMENT", CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    Set(d, name, "IS_VIRTUAL", CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (by_value) {
      const bool yes = true;
      Set(d, name, "IS_BY_VALUE", CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    Finalize(d, name);
    return status_.ok() ? d : nullptr;
  }
  // A virtual intermediate with the next free uid.
  TensorDesc Virtual(const char* name, cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
    return Tensor(name, next_virtual_uid_++, dt, dims, strides, /*is_virtual=*/true);
  }
  // An fp32 scalar passed by value (host pointer in the variant pack).
  TensorDesc Scalar(const char* name, int64_t uid) {
    return Tensor(name, uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, /*is_virtual=*/false, /*by_value=*/true);
  }

  // y = mode(x [, b [, t]]). math: the pointwise compute type. axis >= 0 for GEN_INDEX.
  void Pointwise(const char* name, cudnnPointwiseMode_t mode, cudnnDataType_t math, TensorDesc x, TensorDesc b,
                 TensorDesc t, TensorDesc y, int64_t axis = -1) {
    if (!status_.ok()) return;
    cudnnBackendDescriptor_t pw = Make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, name);
    Set(pw, name, "POINTWISE_MODE", CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    Set(pw, name, "POINTWISE_MATH_PREC", CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (axis >= 0) Set(pw, name, "POINTWISE_AXIS", CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    Finalize(pw, name);
    cudnnBackendDescriptor_t op = Make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
    SetDesc(op, name, "PW_DESCRIPTOR", CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    SetDesc(op, name, "XDESC", CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) SetDesc(op, name, "BDESC", CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t != nullptr) SetDesc(op, name, "TDESC", CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    SetDesc(op, name, "YDESC", CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    const float one = 1.0f;
    Set(op, name, "ALPHA1", CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    Set(op, name, "ALPHA2", CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    Finalize(op, name);
    AddOp(op);
  }
  // c = a b (batched over dims 0, 1), fp32 compute; optional m/n/k overrides (int32 (B,1,1,1)).
  void Matmul(const char* name, TensorDesc a, TensorDesc b, TensorDesc c, TensorDesc m_override = nullptr,
              TensorDesc n_override = nullptr, TensorDesc k_override = nullptr) {
    if (!status_.ok()) return;
    cudnnBackendDescriptor_t mm = Make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, name);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    Set(mm, name, "MATMUL_COMP_TYPE", CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    Finalize(mm, name);
    cudnnBackendDescriptor_t op = Make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
    SetDesc(op, name, "ADESC", CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    SetDesc(op, name, "BDESC", CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    SetDesc(op, name, "CDESC", CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    SetDesc(op, name, "DESC", CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    if (m_override != nullptr) {
      SetDesc(op, name, "GEMM_M_OVERRIDE_DESC", CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m_override);
    }
    if (n_override != nullptr) {
      SetDesc(op, name, "GEMM_N_OVERRIDE_DESC", CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n_override);
    }
    if (k_override != nullptr) {
      SetDesc(op, name, "GEMM_K_OVERRIDE_DESC", CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k_override);
    }
    Finalize(op, name);
    AddOp(op);
  }
  // y = reduce(x) over the dimensions where y has extent 1, fp32 compute.
  void Reduction(const char* name, cudnnReduceTensorOp_t mode, TensorDesc x, TensorDesc y) {
    if (!status_.ok()) return;
    cudnnBackendDescriptor_t rd = Make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    Set(rd, name, "REDUCTION_OPERATOR", CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    Set(rd, name, "REDUCTION_COMP_TYPE", CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    Finalize(rd, name);
    cudnnBackendDescriptor_t op = Make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
    SetDesc(op, name, "XDESC", CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    SetDesc(op, name, "YDESC", CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    SetDesc(op, name, "DESC", CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
    Finalize(op, name);
    AddOp(op);
  }
  // y = x viewed with y's dims and strides (the transposes of P, dS and K in the backward).
  void Reshape(const char* name, TensorDesc x, TensorDesc y) {
    if (!status_.ok()) return;
    cudnnBackendDescriptor_t op = Make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);
    SetDesc(op, name, "XDESC", CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    SetDesc(op, name, "YDESC", CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    Finalize(op, name);
    AddOp(op);
  }

  // The operation graph over every operation added (needs a handle).
  Desc OperationGraph(cudnnHandle_t handle) {
    if (!status_.ok()) return Desc();
    cudnnBackendDescriptor_t g = nullptr;
    cudnnStatus_t st = api_.CreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g);
    if (st != CUDNN_STATUS_SUCCESS) {
      status_ = CudnnError(api_, st, "creating the operation graph");
      return Desc();
    }
    Desc graph(&api_, g);
    // CUDNN_ATTR_OPERATIONGRAPH_HANDLE (800), deprecated in the 9.19 headers, required before.
    const auto kHandleAttr = static_cast<cudnnBackendAttributeName_t>(800);
    // (No handle: a graph planned for a described device, PlanOnDescribedDevice.)
    if (handle != nullptr) Set(g, "operation graph", "HANDLE", kHandleAttr, CUDNN_TYPE_HANDLE, 1, &handle);
    Set(g, "operation graph", "OPS", CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<int64_t>(op_ptrs_.size()), op_ptrs_.data());
    Finalize(g, "operation graph");
    return status_.ok() ? std::move(graph) : Desc();
  }

 private:
  cudnnBackendDescriptor_t Make(cudnnBackendDescriptorType_t type, const char* name) {
    if (!status_.ok()) return nullptr;
    cudnnBackendDescriptor_t d = nullptr;
    cudnnStatus_t st = api_.CreateDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
      status_ = CudnnError(api_, st, fmt::format("creating descriptor type {} for '{}'", int(type), name));
      return nullptr;
    }
    owned_.emplace_back(&api_, d);
    return d;
  }
  void Set(cudnnBackendDescriptor_t d, const char* name, const char* attr_name, cudnnBackendAttributeName_t attr,
           cudnnBackendAttributeType_t type, int64_t count, const void* values) {
    if (!status_.ok()) return;
    cudnnStatus_t st = api_.SetAttribute(d, attr, type, count, values);
    if (st != CUDNN_STATUS_SUCCESS) status_ = CudnnError(api_, st, fmt::format("'{}': setting {}", name, attr_name));
  }
  void SetDesc(cudnnBackendDescriptor_t d, const char* name, const char* attr_name, cudnnBackendAttributeName_t attr,
               cudnnBackendDescriptor_t value) {
    if (!status_.ok()) return;
    if (value == nullptr) {
      status_ = Status::Internal("cuDNN graph '{}': {} is null (internal error)", name, attr_name);
      return;
    }
    Set(d, name, attr_name, attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  void Finalize(cudnnBackendDescriptor_t d, const char* name) {
    if (!status_.ok()) return;
    cudnnStatus_t st = api_.Finalize(d);
    if (st != CUDNN_STATUS_SUCCESS) status_ = CudnnError(api_, st, fmt::format("finalizing '{}'", name));
  }
  void AddOp(cudnnBackendDescriptor_t op) {
    if (status_.ok()) op_ptrs_.push_back(op);
  }

  const Cudnn& api_;
  Status status_;
  std::vector<Desc> owned_;
  std::vector<cudnnBackendDescriptor_t> op_ptrs_;
  int64_t next_virtual_uid_ = 1000;
};

// Unique ids of the non-virtual tensors (the variant pack binds pointers to them).
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kMaskFill,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,
  kOne,
  kDQAccum,
  kSeqLenQ,
  kSeqLenKV,
};

// The shape and the graph variant of one plan.
struct GraphSpec {
  int64_t B, T, C, NH, hs;
  bool backward;
  bool deterministic;     // backward: dQ written directly (no fp32 dQ_accum)
  bool padding_workaround;  // backward on cuDNN <= 9.15 with T % 128 != 0 (see the header comment)
};

GraphSpec MakeSpec(bool backward, int B, int T, int C, int NH, bool deterministic, int64_t version) {
  GraphSpec s{B, T, C, NH, C / NH, backward, deterministic, false};
  s.padding_workaround = backward && (T % 128 != 0) && version <= 91500;
  return s;
}

// Adds every tensor and operation of the forward or backward graph to `g` (see the header comment).
void BuildGraph(const GraphSpec& s, GraphBuilder& g) {
  const int64_t B = s.B, H = s.NH, T = s.T, D = s.hs, C = s.C;
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const Dims qkv_dims{B, H, T, D}, qkv_strides{T * 3 * C, D, 3 * C, 1};
  const Dims t_dims{B, H, D, T}, t_strides{T * 3 * C, D, 1, 3 * C};  // Kᵀ, Vᵀ: dims/strides 2<->3
  const Dims o_strides{T * C, D, C, 1};
  const Dims s_dims{B, H, T, T}, s_strides{H * T * T, T * T, T, 1};   // scores (B, NH, Tq, Tk)
  const Dims st_strides{H * T * T, T * T, 1, T};                       // their transpose (B, NH, Tk, Tq)
  const Dims r_dims{B, H, T, 1}, r_strides{H * T, T, 1, 1};            // row statistics
  const Dims packed_strides{H * T * D, T * D, D, 1};

  TensorDesc q = g.Tensor("Q", kQ, bf16, qkv_dims, qkv_strides, false);
  TensorDesc kt = g.Tensor("K^T", kK, bf16, t_dims, t_strides, false);
  TensorDesc scale = g.Scalar("attn_scale", kScale);
  TensorDesc fill = g.Scalar("mask_fill", kMaskFill);
  TensorDesc stats = g.Tensor("stats", kStats, f32, r_dims, r_strides, false);

  // Causal mask on `x` (the scaled scores): keep where row >= col, else the fill value.
  auto causal = [&](TensorDesc x, const char* out_name) {
    TensorDesc row = g.Virtual("row_index", CUDNN_DATA_INT32, s_dims, s_strides);
    TensorDesc col = g.Virtual("col_index", CUDNN_DATA_INT32, s_dims, s_strides);
    TensorDesc keep = g.Virtual("row>=col", CUDNN_DATA_BOOLEAN, s_dims, s_strides);
    TensorDesc y = g.Virtual(out_name, f32, s_dims, s_strides);
    g.Pointwise("gen_row_idx_causal", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, x, nullptr, nullptr, row, 2);
    g.Pointwise("gen_col_idx_causal", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, x, nullptr, nullptr, col, 3);
    g.Pointwise("row_greater_than_col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
    g.Pointwise("causal_select", CUDNN_POINTWISE_BINARY_SELECT, f32, x, fill, keep, y);
    return y;
  };

  if (!s.backward) {
    TensorDesc v = g.Tensor("V", kV, bf16, qkv_dims, qkv_strides, false);
    TensorDesc o = g.Tensor("O", kO, bf16, qkv_dims, o_strides, false);
    TensorDesc s0 = g.Virtual("S", f32, s_dims, s_strides);
    TensorDesc s1 = g.Virtual("S*scale", f32, s_dims, s_strides);
    g.Matmul("bmm1 Q.K^T", q, kt, s0);
    g.Pointwise("attn_scale", CUDNN_POINTWISE_MUL, f32, s0, scale, nullptr, s1);
    TensorDesc s2 = causal(s1, "S masked");
    TensorDesc mx = g.Virtual("max", f32, r_dims, r_strides);
    TensorDesc sub = g.Virtual("S-max", f32, s_dims, s_strides);
    TensorDesc e = g.Virtual("exp(S-max)", f32, s_dims, s_strides);
    TensorDesc sum = g.Virtual("sum_exp", f32, r_dims, r_strides);
    TensorDesc lg = g.Virtual("log(sum_exp)", f32, r_dims, r_strides);
    TensorDesc p = g.Virtual("P", bf16, s_dims, s_strides);  // bmm2's A operand in the I/O type
    g.Reduction("max", CUDNN_REDUCE_TENSOR_MAX, s2, mx);
    g.Pointwise("sub", CUDNN_POINTWISE_SUB, f32, s2, mx, nullptr, sub);
    g.Pointwise("exp", CUDNN_POINTWISE_EXP, f32, sub, nullptr, nullptr, e);
    g.Reduction("sum", CUDNN_REDUCE_TENSOR_ADD, e, sum);
    g.Pointwise("log", CUDNN_POINTWISE_LOG, f32, sum, nullptr, nullptr, lg);
    g.Pointwise("stats = max + log", CUDNN_POINTWISE_ADD, f32, mx, lg, nullptr, stats);
    g.Pointwise("div", CUDNN_POINTWISE_DIV, f32, e, sum, nullptr, p);
    g.Matmul("bmm2 P.V", p, v, o);
    return;
  }

  TensorDesc vt = g.Tensor("V^T", kV, bf16, t_dims, t_strides, false);
  TensorDesc o = g.Tensor("O", kO, bf16, qkv_dims, o_strides, false);
  TensorDesc dout = g.Tensor("dO", kDO, bf16, qkv_dims, o_strides, false);
  TensorDesc dq = g.Tensor("dQ", kDQ, bf16, qkv_dims, qkv_strides, false);
  TensorDesc dk = g.Tensor("dK", kDK, bf16, qkv_dims, qkv_strides, false);
  TensorDesc dv = g.Tensor("dV", kDV, bf16, qkv_dims, qkv_strides, false);
  TensorDesc one = g.Scalar("one", kOne);
  TensorDesc seq_q = nullptr, seq_kv = nullptr;
  if (s.padding_workaround) {
    seq_q = g.Tensor("seq_len_q", kSeqLenQ, CUDNN_DATA_INT32, {B, 1, 1, 1}, {1, 1, 1, 1}, false);
    seq_kv = g.Tensor("seq_len_kv", kSeqLenKV, CUDNN_DATA_INT32, {B, 1, 1, 1}, {1, 1, 1, 1}, false);
  }

  // D = rowsum(dO * O) (* 1), non-virtual fp32 (B, NH, T, 1) in our workspace.
  TensorDesc dout_o = g.Virtual("dO*O", f32, qkv_dims, packed_strides);
  TensorDesc dsum = g.Virtual("rowsum(dO*O)", f32, r_dims, r_strides);
  TensorDesc softmax_sum = g.Tensor("softmax_sum", kSoftmaxSum, f32, r_dims, r_strides, false);
  g.Pointwise("mul_dO_O", CUDNN_POINTWISE_MUL, f32, dout, o, nullptr, dout_o);
  g.Reduction("reduce_dO_o", CUDNN_REDUCE_TENSOR_ADD, dout_o, dsum);
  g.Pointwise("scale_dropout_inv", CUDNN_POINTWISE_MUL, f32, dsum, one, nullptr, softmax_sum);

  // P = exp(S * scale - stats), masked.
  TensorDesc s0 = g.Virtual("S", f32, s_dims, s_strides);
  TensorDesc s1 = g.Virtual("S*scale", f32, s_dims, s_strides);
  TensorDesc s2 = g.Virtual("S-stats", f32, s_dims, s_strides);
  g.Matmul("matmul_Q_KT", q, kt, s0, seq_q, seq_kv);
  g.Pointwise("mul_s_attn_scale", CUDNN_POINTWISE_MUL, f32, s0, scale, nullptr, s1);
  g.Pointwise("sub_s_m", CUDNN_POINTWISE_SUB, f32, s1, stats, nullptr, s2);
  TensorDesc s3 = s2;
  if (s.padding_workaround) {
    TensorDesc row = g.Virtual("row_index_padding", CUDNN_DATA_INT32, s_dims, s_strides);
    TensorDesc col = g.Virtual("col_index_padding", CUDNN_DATA_INT32, s_dims, s_strides);
    TensorDesc row_ok = g.Virtual("row<seq_q", CUDNN_DATA_BOOLEAN, s_dims, s_strides);
    TensorDesc col_ok = g.Virtual("col<seq_kv", CUDNN_DATA_BOOLEAN, s_dims, s_strides);
    TensorDesc both = g.Virtual("row_and_col", CUDNN_DATA_BOOLEAN, s_dims, s_strides);
    s3 = g.Virtual("S padded", f32, s_dims, s_strides);
    g.Pointwise("gen_row_idx_padding", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s2, nullptr, nullptr, row, 2);
    g.Pointwise("gen_col_idx_padding", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s2, nullptr, nullptr, col, 3);
    g.Pointwise("lt_row_sq_padding", CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, row, seq_q, nullptr, row_ok);
    g.Pointwise("lt_col_skv_padding", CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, col, seq_kv, nullptr, col_ok);
    g.Pointwise("and_row_col_padding", CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, row_ok, col_ok, nullptr,
                both);
    g.Pointwise("select_padding", CUDNN_POINTWISE_BINARY_SELECT, f32, s2, fill, both, s3);
  }
  TensorDesc s4 = causal(s3, "S-stats masked");
  TensorDesc p = g.Virtual("P=exp", f32, s_dims, s_strides);
  g.Pointwise("exp_s", CUDNN_POINTWISE_EXP, f32, s4, nullptr, nullptr, p);

  // dV = Pᵀ dO.
  TensorDesc pt = g.Virtual("P^T", bf16, s_dims, st_strides);
  g.Reshape("reshape_p", p, pt);
  g.Matmul("matmul_pT_dO", pt, dout, dv, seq_kv, nullptr, seq_q);

  // dS = P * (dO Vᵀ - D) * scale.
  TensorDesc dp = g.Virtual("dP", f32, s_dims, s_strides);
  TensorDesc dp_d = g.Virtual("dP-D", f32, s_dims, s_strides);
  TensorDesc ds0 = g.Virtual("P*(dP-D)", f32, s_dims, s_strides);
  TensorDesc ds = g.Virtual("dS", f32, s_dims, s_strides);
  g.Matmul("matmul_dO_VT", dout, vt, dp, seq_q, seq_kv);
  g.Pointwise("sub_dP_softmax_sum", CUDNN_POINTWISE_SUB, f32, dp, softmax_sum, nullptr, dp_d);
  g.Pointwise("mul_dP_exp_s", CUDNN_POINTWISE_MUL, f32, dp_d, p, nullptr, ds0);
  g.Pointwise("mul_dS_attn_scale", CUDNN_POINTWISE_MUL, f32, ds0, scale, nullptr, ds);

  // dK = dSᵀ Q.
  TensorDesc dst = g.Virtual("dS^T", bf16, s_dims, st_strides);
  g.Reshape("reshape_dS", ds, dst);
  g.Matmul("matmul_dST_Q", dst, q, dk, seq_kv, nullptr, seq_q);

  // dQ = dS K, K as the reshape of Kᵀ back to (B, NH, T, hs) (fp32 virtual, as the frontend's).
  TensorDesc k = g.Virtual("K", f32, qkv_dims, qkv_strides);
  g.Reshape("reshape_k", kt, k);
  if (s.deterministic) {
    g.Matmul("matmul_dS_K", ds, k, dq, seq_q, nullptr, seq_kv);
  } else {
    TensorDesc acc = g.Tensor("dQ_accum", kDQAccum, f32, qkv_dims, packed_strides, false);
    g.Matmul("matmul_dS_K", ds, k, acc, seq_q, nullptr, seq_kv);
    g.Pointwise("identity_dQ", CUDNN_POINTWISE_IDENTITY, f32, acc, nullptr, nullptr, dq);
  }
}

size_t RoundUp256(size_t n) { return (n + 255) / 256 * 256; }

// The engine configurations heuristics `mode` offers for a finalized operation graph (at most 64, in
// the heuristics' order), for the described device `devprop` when non-null (else the graph's
// handle's device). `heur` keeps the heuristics descriptor alive with its results.
struct EngineConfigs {
  Desc heur;
  std::vector<Desc> cfgs;
  std::vector<cudnnBackendDescriptor_t> ptrs;
};
StatusOr<EngineConfigs> GetEngineConfigs(const Cudnn& api, cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                                         cudnnBackendDescriptor_t devprop, const char* mode_name) {
  EngineConfigs r;
  cudnnBackendDescriptor_t h = nullptr;
  cudnnStatus_t st = api.CreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &h);
  if (st != CUDNN_STATUS_SUCCESS) return CudnnError(api, st, "creating the heuristics descriptor");
  r.heur = Desc(&api, h);
  st = api.SetAttribute(h, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  if (st == CUDNN_STATUS_SUCCESS) st = api.SetAttribute(h, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (st == CUDNN_STATUS_SUCCESS && devprop != nullptr) {
    st = api.SetAttribute(h, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
  }
  if (st == CUDNN_STATUS_SUCCESS) st = api.Finalize(h);
  int64_t count = 0;
  if (st == CUDNN_STATUS_SUCCESS) {
    st = api.GetAttribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
  }
  if (st != CUDNN_STATUS_SUCCESS) return CudnnError(api, st, mode_name);
  count = std::min<int64_t>(count, 64);
  for (int64_t i = 0; i < count; ++i) {
    cudnnBackendDescriptor_t c = nullptr;
    st = api.CreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &c);
    if (st != CUDNN_STATUS_SUCCESS) return CudnnError(api, st, "creating engine configs");
    r.cfgs.emplace_back(&api, c);
    r.ptrs.push_back(c);
  }
  int64_t got = 0;
  if (count > 0) {
    st = api.GetAttribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, r.ptrs.data());
    if (st != CUDNN_STATUS_SUCCESS) return CudnnError(api, st, std::string(mode_name) + " results");
  }
  r.ptrs.resize(static_cast<size_t>(std::min(got, count)));  // only the configs actually returned
  return r;
}

Status ValidateShape(int B, int T, int C, int NH, DType dt) {
  if (dt != DType::kBF16) {
    return Status::InvalidArgument("cuDNN attention supports bf16 storage only (got {}); fp32 runs our own kernels",
                                   DTypeName(dt));
  }
  if (B < 1 || T < 1 || NH < 1 || C < 1 || C % NH != 0) {
    return Status::InvalidArgument("cuDNN attention: bad shape B={} T={} C={} NH={} (need B, T, NH >= 1, C % NH == 0)",
                                   B, T, C, NH);
  }
  const int hs = C / NH;
  if (hs % 8 != 0 || hs > 128) {
    return Status::InvalidArgument("cuDNN attention: head size {} must be a multiple of 8 and <= 128", hs);
  }
  return Status::OK();
}

Status CheckPointer(const void* p, const char* name, size_t align = 16) {
  if (p == nullptr) return Status::InvalidArgument("cuDNN attention: {} is null", name);
  if (reinterpret_cast<uintptr_t>(p) % align != 0) {
    return Status::InvalidArgument("cuDNN attention: {} is not {}-byte aligned", name, align);
  }
  return Status::OK();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------

struct CudnnAttention::Plan {
  Desc plan;                     // finalized execution plan
  bool backward = false;
  int64_t cudnn_workspace = 0;   // the plan's own workspace
  size_t softmax_sum_offset = 0, dq_accum_offset = 0, cudnn_offset = 0, total_bytes = 0;
  bool has_dq_accum = false;
  DeviceBuffer seq_lens;         // padding workaround: int32 seq_len_q (B), seq_len_kv (B), all = T
  size_t seq_kv_offset = 0;      // element offset of seq_len_kv in seq_lens
  float scale = 0, mask_fill = 0, one = 1.0f;  // by-value scalars (host memory read at execute)
  std::string engine;            // for Describe()
};

Status CudnnLibraryStatus() {
  const Cudnn& api = LoadCudnn();
  if (!api.ok()) return Status::NotFound("{}", api.error);
  return Status::OK();
}

std::string CudnnLibraryDescription() {
  const Cudnn& api = LoadCudnn();
  if (!api.ok()) return "not available: " + api.error;
  return fmt::format("{}.{}.{} from {}", api.version / 10000, api.version / 100 % 100, api.version % 100, api.path);
}

Status ProbeCudnnLibrary(const std::string& path) {
  TF_ASSIGN_OR_RETURN(DynamicLibrary lib, DynamicLibrary::Open(path));
  Cudnn c;
  return ResolveCudnn(lib, &c).WithContext(lib.path());
}

StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(CudnnAttentionOptions options) {
  const Cudnn& api = LoadCudnn();
  if (!api.ok()) return Status::NotFound("{}", api.error);
  if (DeviceCount() == 0) return Status::NotFound("cuDNN attention: no CUDA device visible");
  std::unique_ptr<CudnnAttention> a(new CudnnAttention());
  a->options_ = options;
  TF_CUDA_RETURN_IF_ERROR(cudaGetDevice(&a->device_));
  cudnnHandle_t h = nullptr;
  cudnnStatus_t st = api.Create(&h);
  if (st != CUDNN_STATUS_SUCCESS) {
    return CudnnError(api, st, fmt::format("cudnnCreate ({} on device {})", api.path, a->device_));
  }
  a->handle_ = h;
  return a;
}

CudnnAttention::~CudnnAttention() {
  plans_.clear();  // descriptors before the handle
  if (handle_ != nullptr) LoadCudnn().Destroy(static_cast<cudnnHandle_t>(handle_));
}

std::string CudnnAttention::Describe() const {
  const Cudnn& api = LoadCudnn();
  std::string s = fmt::format("cuDNN {} ({}), {} backward", api.version, api.path,
                              options_.deterministic ? "deterministic" : "non-deterministic");
  for (const auto& [key, plan] : plans_) {
    const auto& [dir, B, T, C, NH] = key;
    s += fmt::format("; {} B={} T={} C={} NH={}: {}, workspace {} B", dir == 0 ? "fwd" : "bwd", B, T, C, NH,
                     plan->engine, plan->total_bytes);
  }
  return s;
}

Status CudnnAttention::CheckGraphOnHost(Direction dir, int B, int T, int C, int NH, CudnnAttentionOptions options,
                                        int64_t cudnn_version) {
  const Cudnn& api = LoadCudnn();
  if (!api.ok()) return Status::NotFound("{}", api.error);
  TF_RETURN_IF_ERROR(ValidateShape(B, T, C, NH, DType::kBF16));
  const GraphSpec spec = MakeSpec(dir == Direction::kBackward, B, T, C, NH, options.deterministic,
                                  cudnn_version != 0 ? cudnn_version : api.version);
  GraphBuilder g(api);
  BuildGraph(spec, g);
  return g.status();
}

StatusOr<CudnnAttention::DescribedDevicePlan> CudnnAttention::PlanOnDescribedDevice(
    Direction dir, int B, int T, int C, int NH, const std::string& device_json, CudnnAttentionOptions options) {
  const Cudnn& api = LoadCudnn();
  if (!api.ok()) return Status::NotFound("{}", api.error);
  TF_RETURN_IF_ERROR(ValidateShape(B, T, C, NH, DType::kBF16));
  const bool backward = dir == Direction::kBackward;
  const std::string what = fmt::format("cuDNN attention {} B={} T={} C={} NH={} on a described device",
                                       backward ? "backward" : "forward", B, T, C, NH);
  cudnnBackendDescriptor_t d = nullptr;
  cudnnStatus_t st = api.CreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &d);
  if (st != CUDNN_STATUS_SUCCESS) return CudnnError(api, st, "creating a device description").WithContext(what);
  Desc device(&api, d);
  st = api.SetAttribute(d, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                        static_cast<int64_t>(device_json.size()), device_json.data());
  if (st == CUDNN_STATUS_SUCCESS) st = api.Finalize(d);
  if (st != CUDNN_STATUS_SUCCESS) return CudnnError(api, st, "the device description").WithContext(what);

  const GraphSpec spec = MakeSpec(backward, B, T, C, NH, options.deterministic, api.version);
  GraphBuilder g(api);
  BuildGraph(spec, g);
  Desc graph = g.OperationGraph(nullptr);
  if (!g.status().ok()) return g.status().WithContext(what);

  auto configs = GetEngineConfigs(api, graph.get(), CUDNN_HEUR_MODE_A, d, "heuristics A");
  if (!configs.ok()) return configs.status().WithContext(what);
  const std::vector<cudnnBackendDescriptor_t>& cfg_ptrs = configs->ptrs;
  DescribedDevicePlan r;
  r.engine_configs = static_cast<int>(cfg_ptrs.size());
  if (r.engine_configs == 0) return r;
  int64_t n = 0;
  api.GetAttribute(cfg_ptrs[0], CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &r.config_workspace);
  cudnnBackendDescriptor_t p = nullptr;
  st = api.CreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p);
  if (st != CUDNN_STATUS_SUCCESS) return CudnnError(api, st, "creating an execution plan").WithContext(what);
  Desc exec_plan(&api, p);
  st = api.SetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
  if (st == CUDNN_STATUS_SUCCESS) {
    st = api.SetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg_ptrs[0]);
  }
  if (st == CUDNN_STATUS_SUCCESS) st = api.Finalize(p);
  r.compiled = st == CUDNN_STATUS_SUCCESS || st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER;
  r.plan_status = st == CUDNN_STATUS_SUCCESS ? "finalized" : CudnnError(api, st, "execution plan").message();
  return r;
}

StatusOr<CudnnAttention::Plan*> CudnnAttention::GetPlan(Direction dir, int B, int T, int C, int NH) {
  int device = -1;
  TF_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (device != device_) {
    return Status::InvalidArgument("cuDNN attention: created on device {}, called on device {}", device_, device);
  }
  const auto key = std::make_tuple(dir == Direction::kForward ? 0 : 1, B, T, C, NH);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();

  const Cudnn& api = LoadCudnn();
  auto handle = static_cast<cudnnHandle_t>(handle_);
  const bool backward = dir == Direction::kBackward;
  const GraphSpec spec = MakeSpec(backward, B, T, C, NH, options_.deterministic, api.version);
  const std::string what = fmt::format("cuDNN attention {} B={} T={} C={} NH={}", backward ? "backward" : "forward",
                                       B, T, C, NH);
  GraphBuilder g(api);
  BuildGraph(spec, g);
  Desc graph = g.OperationGraph(handle);
  if (!g.status().ok()) return g.status().WithContext(what);

  auto plan = std::make_unique<Plan>();
  plan->backward = backward;
  plan->scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(C / NH)));
  plan->mask_fill = -std::numeric_limits<float>::infinity();

  // Heuristics (mode A, then FALLBACK); the first config whose plan finalizes. Errors are collected
  // so that a failure says what every attempt answered.
  std::vector<std::string> notes;
  bool found = false;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "heuristics A" : "heuristics FALLBACK";
    auto configs = GetEngineConfigs(api, graph.get(), mode, nullptr, mode_name);
    if (!configs.ok()) {
      notes.push_back(configs.status().message());
      continue;
    }
    const std::vector<cudnnBackendDescriptor_t>& cfg_ptrs = configs->ptrs;
    const int64_t got = static_cast<int64_t>(cfg_ptrs.size()), count = got;
    if (got == 0) notes.push_back(fmt::format("{}: no engine configs", mode_name));
    for (int64_t i = 0; i < std::min(got, count) && !found; ++i) {
      // The engine behind the config: its global index (for logs) and numerical notes.
      int64_t engine_index = -1;
      bool nondeterministic = false;
      cudnnBackendDescriptor_t e = nullptr;
      if (api.CreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &e) == CUDNN_STATUS_SUCCESS) {
        Desc engine(&api, e);
        int64_t n = 0;
        if (api.GetAttribute(cfg_ptrs[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e) ==
            CUDNN_STATUS_SUCCESS) {
          api.GetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &engine_index);
          std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> note_list{};
          int64_t n_notes = 0;
          if (api.GetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               static_cast<int64_t>(note_list.size()), &n_notes,
                               note_list.data()) == CUDNN_STATUS_SUCCESS) {
            for (int64_t j = 0; j < std::min<int64_t>(n_notes, note_list.size()); ++j) {
              if (note_list[j] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) nondeterministic = true;
            }
          }
        }
      }
      if (backward && options_.deterministic && nondeterministic) {
        notes.push_back(fmt::format("{} engine {}: skipped (nondeterministic)", mode_name, engine_index));
        continue;
      }
      cudnnBackendDescriptor_t p = nullptr;
      cudnnStatus_t st = api.CreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p);
      if (st != CUDNN_STATUS_SUCCESS) return CudnnError(api, st, "creating an execution plan").WithContext(what);
      Desc exec_plan(&api, p);
      // CUDNN_ATTR_EXECUTION_PLAN_HANDLE (400), deprecated in the 9.19 headers, required before.
      const auto kPlanHandleAttr = static_cast<cudnnBackendAttributeName_t>(400);
      st = api.SetAttribute(p, kPlanHandleAttr, CUDNN_TYPE_HANDLE, 1, &handle);
      if (st == CUDNN_STATUS_SUCCESS) {
        st = api.SetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                              &cfg_ptrs[i]);
      }
      if (st == CUDNN_STATUS_SUCCESS) st = api.Finalize(p);
      int64_t ws = 0, n = 0;
      if (st == CUDNN_STATUS_SUCCESS) {
        st = api.GetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
      }
      if (st != CUDNN_STATUS_SUCCESS) {
        notes.push_back(CudnnError(api, st, fmt::format("{} engine {}", mode_name, engine_index)).message());
        continue;
      }
      plan->plan = std::move(exec_plan);
      plan->cudnn_workspace = std::max<int64_t>(ws, 0);
      plan->engine = fmt::format("engine {} ({}, config {}{})", engine_index, mode_name, i,
                                 nondeterministic ? ", nondeterministic" : "");
      found = true;
    }
    if (found) break;
  }
  if (!found) {
    return Status::Unimplemented("{}: no cuDNN engine accepts the graph (cuDNN {}): {}", what, api.version,
                                 fmt::join(notes, "; "));
  }

  // Workspace layout: [softmax_sum][dQ_accum][cuDNN's workspace], each 256-byte aligned.
  size_t off = 0;
  if (backward) {
    plan->softmax_sum_offset = off;
    off += RoundUp256(static_cast<size_t>(B) * NH * T * sizeof(float));
    if (!spec.deterministic) {
      plan->has_dq_accum = true;
      plan->dq_accum_offset = off;
      off += RoundUp256(static_cast<size_t>(B) * NH * T * (C / NH) * sizeof(float));
    }
  }
  plan->cudnn_offset = off;
  plan->total_bytes = off + RoundUp256(static_cast<size_t>(plan->cudnn_workspace));
  if (spec.padding_workaround) {
    // seq_len_q at element 0, seq_len_kv at element kv_offset (64 int32 = 256 bytes apart at least,
    // keeping the declared 16-byte alignment).
    plan->seq_kv_offset = (static_cast<size_t>(B) + 63) / 64 * 64;
    auto buf = DeviceBuffer::Allocate(2 * plan->seq_kv_offset * sizeof(int32_t));
    if (!buf.ok()) return buf.status().WithContext(what + ": sequence-length buffer");
    plan->seq_lens = std::move(*buf);
    std::vector<int32_t> lens(2 * plan->seq_kv_offset, T);
    TF_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(plan->seq_lens.data(), lens.data(), lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  ++plans_built_;
  return raw;
}

StatusOr<size_t> CudnnAttention::WorkspaceBytes(Direction dir, int B, int T, int C, int NH) {
  TF_RETURN_IF_ERROR(ValidateShape(B, T, C, NH, DType::kBF16));
  auto plan = GetPlan(dir, B, T, C, NH);
  if (!plan.ok()) return plan.status();
  return (*plan)->total_bytes;
}

namespace {

// Binds pointers to uids and runs `plan` on `stream`.
Status Execute(const Cudnn& api, cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
               const std::vector<int64_t>& uids, const std::vector<void*>& ptrs, void* workspace,
               cudaStream_t stream, const std::string& what) {
  cudnnStatus_t st = api.SetStream(handle, stream);
  if (st != CUDNN_STATUS_SUCCESS) return CudnnError(api, st, what + ": cudnnSetStream");
  cudnnBackendDescriptor_t vp = nullptr;
  st = api.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (st != CUDNN_STATUS_SUCCESS) return CudnnError(api, st, what + ": creating the variant pack");
  Desc pack(&api, vp);
  st = api.SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
                        uids.data());
  if (st == CUDNN_STATUS_SUCCESS) {
    st = api.SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                          static_cast<int64_t>(ptrs.size()), ptrs.data());
  }
  if (st == CUDNN_STATUS_SUCCESS) {
    st = api.SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  }
  if (st == CUDNN_STATUS_SUCCESS) st = api.Finalize(vp);
  if (st != CUDNN_STATUS_SUCCESS) return CudnnError(api, st, what + ": variant pack");
  st = api.Execute(handle, plan, vp);
  if (st != CUDNN_STATUS_SUCCESS) return CudnnError(api, st, what + ": cudnnBackendExecute");
  return Status::OK();
}

Status CheckWorkspace(const CudnnAttention::Plan& plan, void* workspace, size_t workspace_bytes) {
  if (workspace_bytes < plan.total_bytes) {
    return Status::InvalidArgument("cuDNN attention: workspace of {} bytes, the plan needs {}", workspace_bytes,
                                   plan.total_bytes);
  }
  if (plan.total_bytes > 0) return CheckPointer(workspace, "workspace", 256);
  return Status::OK();
}

}  // namespace

Status CudnnAttention::Forward(void* out, float* lse, const void* qkv, int B, int T, int C, int NH, DType dt,
                               void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  TF_RETURN_IF_ERROR(ValidateShape(B, T, C, NH, dt));
  TF_RETURN_IF_ERROR(CheckPointer(out, "out"));
  TF_RETURN_IF_ERROR(CheckPointer(lse, "lse"));
  TF_RETURN_IF_ERROR(CheckPointer(qkv, "qkv"));
  auto p = GetPlan(Direction::kForward, B, T, C, NH);
  if (!p.ok()) return p.status();
  Plan& plan = **p;
  TF_RETURN_IF_ERROR(CheckWorkspace(plan, workspace, workspace_bytes));
  const auto* base = static_cast<const char*>(qkv);
  const size_t row = static_cast<size_t>(C) * 2;  // bytes of C bf16
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale, kMaskFill};
  std::vector<void*> ptrs = {const_cast<char*>(base), const_cast<char*>(base + row), const_cast<char*>(base + 2 * row),
                             out, lse, &plan.scale, &plan.mask_fill};
  void* ws = plan.cudnn_workspace > 0 ? static_cast<char*>(workspace) + plan.cudnn_offset : nullptr;
  return Execute(LoadCudnn(), static_cast<cudnnHandle_t>(handle_), plan.plan.get(), uids, ptrs, ws, stream,
                 "cuDNN attention forward");
}

Status CudnnAttention::Backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                                int B, int T, int C, int NH, DType dt, void* workspace, size_t workspace_bytes,
                                cudaStream_t stream) {
  TF_RETURN_IF_ERROR(ValidateShape(B, T, C, NH, dt));
  TF_RETURN_IF_ERROR(CheckPointer(dqkv, "dqkv"));
  TF_RETURN_IF_ERROR(CheckPointer(dout, "dout"));
  TF_RETURN_IF_ERROR(CheckPointer(qkv, "qkv"));
  TF_RETURN_IF_ERROR(CheckPointer(out, "out"));
  TF_RETURN_IF_ERROR(CheckPointer(lse, "lse"));
  auto p = GetPlan(Direction::kBackward, B, T, C, NH);
  if (!p.ok()) return p.status();
  Plan& plan = **p;
  TF_RETURN_IF_ERROR(CheckWorkspace(plan, workspace, workspace_bytes));
  const auto* in = static_cast<const char*>(qkv);
  auto* grad = static_cast<char*>(dqkv);
  const size_t row = static_cast<size_t>(C) * 2;
  auto* ws = static_cast<char*>(workspace);
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale, kMaskFill, kDO, kDQ, kDK, kDV, kSoftmaxSum, kOne};
  std::vector<void*> ptrs = {const_cast<char*>(in),
                             const_cast<char*>(in + row),
                             const_cast<char*>(in + 2 * row),
                             const_cast<void*>(out),
                             const_cast<float*>(lse),
                             &plan.scale,
                             &plan.mask_fill,
                             const_cast<void*>(dout),
                             grad,
                             grad + row,
                             grad + 2 * row,
                             ws + plan.softmax_sum_offset,
                             &plan.one};
  if (plan.has_dq_accum) {
    uids.push_back(kDQAccum);
    ptrs.push_back(ws + plan.dq_accum_offset);
  }
  if (plan.seq_lens.data() != nullptr) {
    uids.push_back(kSeqLenQ);
    ptrs.push_back(plan.seq_lens.as<int32_t>());
    uids.push_back(kSeqLenKV);
    ptrs.push_back(plan.seq_lens.as<int32_t>() + plan.seq_kv_offset);
  }
  void* cudnn_ws = plan.cudnn_workspace > 0 ? ws + plan.cudnn_offset : nullptr;
  return Execute(LoadCudnn(), static_cast<cudnnHandle_t>(handle_), plan.plan.get(), uids, ptrs, cudnn_ws, stream,
                 "cuDNN attention backward");
}

#endif  // TF_HAVE_CUDNN_HEADERS
}  // namespace tf::cuda
#endif  // TF_WITH_CUDA
