// KvCache: the interface between the model's forward pass and KV storage. The model computes
// roped K/V rows and asks the cache to store them (write); the attention runner (attention/)
// attends over what it holds: over a paged cache's blocks (paged_layer) as its backend's
// paged_attention, else through the cache's own attention. How K/V are laid out, quantised or paged
// is the cache's business (the paged, mixed-precision cache replaces the contiguous one without
// touching model code). One sequence per cache object for now. Not thread-safe: called from the
// engine thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bie/backend/backend.h"
#include "bie/backend/kv_block_view.h"
#include "bie/common/result.h"

namespace bie {

namespace kv {
// One sequence's K/V of one layer as paged blocks in a backend's memory: logical block b of the
// sequence is blocks[b] of pools (the layer group's pools, kv::PoolKind order), layer
// layer_in_group of each block. Valid until the cache's next call or block change.
struct PagedKvLayer {
  Backend* backend = nullptr;  // holds the pools and runs paged_attention over them
  std::span<const KvPoolDesc> pools;
  std::span<const KvBlockRef> blocks;  // [ceil(n_ctx / block_size)]
  int layer_in_group = 0;
  int n_layers_in_group = 1;
  int n_head_kv = 0;
  int head_dim = 0;
  int block_size = 16;
  bool rotate_keys = false;  // keys stored Hadamard-rotated per head
};
}  // namespace kv

struct KvGeometry {
  int n_layer = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  // [n_layer] sliding window of each layer in tokens (0: global). Empty: every layer global. A
  // paged store keeps only the window of a local layer (PagedKvStore's layer groups).
  std::vector<int32_t> layer_window;

  [[nodiscard]] int kv_dim() const { return n_head_kv * head_dim; }
  [[nodiscard]] int64_t window(int il) const {
    return layer_window.empty() ? 0 : layer_window[static_cast<size_t>(il)];
  }
};

namespace planner {
struct ModelGeometry;
}
namespace kv {
// A model's KV geometry: its layers, the first layer's KV heads and K width, and each layer's
// sliding window (none kept when every layer is global).
[[nodiscard]] KvGeometry kv_geometry(const planner::ModelGeometry& g);
}  // namespace kv

class KvCache {
 public:
  virtual ~KvCache() = default;

  [[nodiscard]] virtual const KvGeometry& geometry() const = 0;
  // Tokens whose K/V are stored (the next token goes at this position).
  [[nodiscard]] virtual int64_t n_tokens() const = 0;
  // Most tokens this cache can ever hold.
  [[nodiscard]] virtual int64_t capacity() const = 0;

  // Ask-then-act: can_append(n) says whether n more positions fit; append(n) makes positions
  // [n_tokens, n_tokens + n) writable and advances n_tokens. A failed append changes nothing.
  [[nodiscard]] virtual bool can_append(int64_t n) const = 0;
  [[nodiscard]] virtual Status append(int64_t n) = 0;

  // Stores K/V rows for positions [pos0, pos0 + n) of layer il.
  // k, v: [n, n_head_kv * head_dim] fp32, K already roped.
  // note: call only for positions made writable by append().
  virtual void store(int il, int64_t pos0, int64_t n, const float* k, const float* v) = 0;

  // Causal attention of n query tokens at positions [pos0, pos0 + n) over positions
  // [0, pos0 + i] each: out[i, h, :] = sum_j softmax_j(scale * q[i, h] . k[j, h/g]) v[j, h/g].
  // q, out: [n, n_head * head_dim]; n_head must be a multiple of n_head_kv (GQA group size g).
  // window > 0 is a sliding window (local attention layers): query p sees only keys j with
  // p - j < window, i.e. [max(0, p - window + 1), p], llama.cpp's LLAMA_SWA_TYPE_STANDARD mask.
  // window = 0: the whole causal prefix. Keys outside the window stay stored (not freed).
  // A paged cache (paged_layer) is attended by the attention runner instead (attention::attend
  // for host rows); its attend is never called and writes NaN.
  virtual void attend(int il, int64_t pos0, int64_t n, const float* q, int n_head, float scale,
                      float* out, Backend& backend, int64_t window = 0);

  // Layer il's blocks for a pass ending at n_ctx tokens, when this cache holds its K/V as paged
  // blocks in its backend's memory: what the attention runner gives the backend's
  // paged_attention. nullopt (the default): the cache attends itself (attend / attention).
  [[nodiscard]] virtual std::optional<kv::PagedKvLayer> paged_layer(int /*il*/, int64_t /*n_ctx*/) {
    return std::nullopt;
  }
  // The same blocks as host views, where the pools are host-visible (read by the
  // attention-entropy probe). Empty (the default): they are not.
  [[nodiscard]] virtual kv::HostKvBlocks host_blocks(int /*il*/, int64_t /*n_ctx*/) { return {}; }

  // The forward pass's entry points: the same store / attend on backend tensors (q, k, v, out:
  // this sequence's n rows, F32). The paged cache runs them as its backend's operations on the
  // tensors; the defaults below serve a host reference cache: they wait for the backend, then
  // call store / attend on the tensors' host memory (every CPU backend tensor is host-visible).
  [[nodiscard]] virtual Status write(int il, int64_t pos0, const Tensor& k, const Tensor& v,
                                     Backend& backend);
  [[nodiscard]] virtual Status attention(int il, int64_t pos0, const Tensor& q, int n_head,
                                         float scale, const Tensor& out, Backend& backend,
                                         int64_t window = 0);

  // The pass that wrote this cache's newest positions is over (every layer stored and attended
  // them). A paged cache changes block state here, never inside attend: blocks that left the
  // FP16 window move to the body pool, blocks a sliding window no longer reaches are dropped.
  // A move that cannot happen now (body pool full) leaves the block FP16, which is still correct
  // data, and is tried again after the next pass. The caller that ran the pass calls it: the
  // engine's model runner, Model::forward for a single-sequence cache. Default: nothing to do.
  virtual void finish_pass() {}

  // Drops every position >= n (rollback, or reuse of a common prefix); n <= 0 empties the cache.
  // A paged cache may refuse a rollback into blocks already re-quantised out of its FP16 window;
  // it then returns an error and changes nothing.
  [[nodiscard]] virtual Status truncate(int64_t n) = 0;
};

// For KV storage in host memory: waits for the backend, then the host addresses of two F32
// tensors (`what` names them in the error when they live on a device instead).
[[nodiscard]] inline Status host_rows(Backend& backend, const Tensor& a, const Tensor& b,
                                      const char* what, float** pa, float** pb) {
  backend.synchronize();
  *pa = static_cast<float*>(a.host());
  *pb = static_cast<float*>(b.host());
  if (*pa == nullptr || *pb == nullptr) {
    return Error{std::string("KV cache in host memory, but ") + what + " live on the " +
                 backend.name() + " device"};
  }
  return {};
}

inline void KvCache::attend(int /*il*/, int64_t /*pos0*/, int64_t n, const float* /*q*/, int n_head,
                            float /*scale*/, float* out, Backend& /*backend*/, int64_t /*window*/) {
  const size_t len = static_cast<size_t>(n) * static_cast<size_t>(n_head) *
                     static_cast<size_t>(geometry().head_dim);
  std::fill(out, out + len, std::numeric_limits<float>::quiet_NaN());
}

inline Status KvCache::write(int il, int64_t pos0, const Tensor& k, const Tensor& v,
                             Backend& backend) {
  float *kp = nullptr, *vp = nullptr;
  if (Status st = host_rows(backend, k, v, "K/V", &kp, &vp); !st) return st;
  store(il, pos0, k.rows, kp, vp);
  return {};
}

inline Status KvCache::attention(int il, int64_t pos0, const Tensor& q, int n_head, float scale,
                                 const Tensor& out, Backend& backend, int64_t window) {
  float *qp = nullptr, *op = nullptr;
  if (Status st = host_rows(backend, q, out, "queries", &qp, &op); !st) return st;
  attend(il, pos0, q.rows, qp, n_head, scale, op, backend, window);
  return {};
}

}  // namespace bie
