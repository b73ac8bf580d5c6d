// Flash-Next (qwen4_exp): the Qwen3.5-style hybrid (Gated DeltaNet with a sigmoid output gate,
// gated full attention, routed experts with a gated shared one) plus three pieces.
//
//   Hyper-connections: the residual is hc streams [T, hc * E]. Before each block a mix reads them:
//     n = per-stream RMSNorm, w = sigmoid(W_up silu(W_down n / hc)), x = mean_c w_c * n_c; after it
//     the block output y joins stream c scaled by 2 sigmoid(W_inject n / hc)_c. A last mix (no
//     inject) feeds the LM head; there is no final norm.
//   QSA: an indexer scores complete blocks of `ratio` cached tokens (pooled raw keys, normalised and
//     rotated to the block start) against its query heads; each query attends to its top
//     budget / ratio blocks and its incomplete tail only. The raw keys live in the cache's token
//     rows (a cache group the model declares), so prefix hits and offload carry them.
//   n-gram PLE (on its layers, before the mix): the token and its predecessors (cut at EOS) hash
//     into rows of a large table; keyed against each stream, gated, and passed through a dilated
//     causal conv, the result is added to every stream. Its window and conv history are
//     recurrent-state buffers of the request's slot.
//
// Loading reuses the hybrid decoder (hybrid_decoder_lm.h) for attention, DeltaNet and experts; this
// file loads and runs the rest. The PLE table (ple_table.h) stays off the device, in host memory or
// in its file's mapping (ple_offload): a step's rows are gathered on the host and uploaded. The
// checkpoint layout is transformers' (Qwen4ExpForCausalLM, or the language model of
// Qwen4ExpForConditionalGeneration). Its mtp.* block is taken to be Qwen3.5's (fc over the next
// token's embedding and the hidden state the head reads, one gated-attention layer with its own
// norms, no hyper-connections), run by the hybrid decoder's mtp_forward.
//
// Under speculative decoding a rejected draft's recurrent state is rolled back by replaying the
// kept rows: DeltaNet from its input projection (the hybrid decoder's replay), PLE's n-gram window
// from the kept tokens and its conv history from the conv's kept inputs.
#include <cmath>
#include <future>
#include <map>
#include <limits>

#include "core/device_runtime.h"
#include "core/error.h"
#include "model/hybrid_decoder_lm.h"
#include "model/ple_table.h"

namespace revolta {
namespace {

using namespace hybrid;

// One hyper-connection mixer: [W_down; W_inject] stacked (the inject rows absent on the last).
struct HyperConnection {
  Tensor norm, down_inject, up;
};

struct Indexer {
  Tensor proj, q_norm, k_norm;  // proj [(heads + 1) * D, hidden]: the query heads, then the raw key
};

struct Ple {
  PleTable table;
  Tensor key, value, norm_key, norm_query, norm_conv, conv;  // conv [hc * E, (kernel - 1) * n + 1]
  ops::NgramHash hash;
  size_t window_buffer = 0, conv_buffer = 0;  // its StateCache buffers
};

struct FlashLayer {
  HyperConnection attn_hc, mlp_hc;
  Indexer indexer;
  bool has_ple = false;
  Ple ple;
};

uint64_t splitmix64(uint64_t v) {
  v += 0x9E3779B97F4A7C15ull;
  v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
  v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
  return v ^ (v >> 31);
}

bool is_prime(int64_t v) {
  if (v < 2) return false;
  if (v % 2 == 0) return v == 2;
  for (int64_t d = 3; d * d <= v; d += 2)
    if (v % d == 0) return false;
  return true;
}

// The hashing constants transformers derives from the config: odd multipliers below
// INT64_MAX / vocab (so products never overflow), and a distinct prime table size per head, the
// primes after ngram_vocab_size_base in order across PLE layers. `rows`: the table rows they need.
ops::NgramHash derived_ngram_hash(const ModelConfig& c, int32_t ple_index, int64_t& rows) {
  const FlashNextConfig& f = c.flash;
  ops::NgramHash h;
  h.ngram_size = f.ngram_size, h.heads_per_ngram = f.heads_per_ngram, h.eos = c.eos_token_ids[0];
  const uint64_t half = std::max<uint64_t>(1, uint64_t(std::numeric_limits<int64_t>::max() / std::max(c.vocab_size, 1)) / 2);
  const uint64_t base = f.seed + 10007ull * uint64_t(ple_index);
  h.multipliers = Tensor::empty({f.ngram_size}, DType::kI64);
  for (int32_t i = 0; i < f.ngram_size; ++i)
    h.multipliers.ptr<int64_t>()[i] = int64_t(2 * (splitmix64(base + 0x9E3779B97F4A7C15ull * uint64_t(i + 1)) % half) + 1);
  const int32_t heads = f.ple_heads();
  h.sizes = Tensor::empty({heads}, DType::kI64);
  h.offsets = Tensor::empty({heads}, DType::kI64);
  int64_t prime = f.ngram_vocab_base - 1, total = 0;
  for (int64_t skip = 0; skip < int64_t(ple_index) * heads; ++skip)
    for (++prime; !is_prime(prime); ++prime) {}
  for (int32_t i = 0; i < heads; ++i) {
    for (++prime; !is_prime(prime); ++prime) {}
    h.sizes.ptr<int64_t>()[i] = prime;
    h.offsets.ptr<int64_t>()[i] = total;
    total += prime;
  }
  rows = (total + f.ngram_vocab_divisor - 1) / f.ngram_vocab_divisor * f.ngram_vocab_divisor;
  return h;
}

// The constants as the checkpoint stores them (transformers saves them as buffers, llama.cpp's
// GGUF as keys), which win over the derivation: a released model need not use the default seed.
bool stored_ngram_hash(const WeightLoader& w, const ModelConfig& c, const std::string& p, ops::NgramHash& h) {
  const std::string m = p + "layer_multipliers", o = p + "ngram_heads_offsets", v = p + "ngram_heads_vocab_sizes";
  if (w.dummy() || !w.has(m)) return false;
  const FlashNextConfig& f = c.flash;
  const auto read = [&](const std::string& name, int64_t n) {
    Tensor t = w.mapped(name, {n}, DType::kI64);
    RV_CHECK(t.dtype() == DType::kI64, "model: ", name, " must be int64 (it is ", dtype_name(t.dtype()), ")");
    Tensor copy = Tensor::empty({n}, DType::kI64);
    std::copy_n(t.ptr<int64_t>(), n, copy.ptr<int64_t>());
    return copy;
  };
  h.ngram_size = f.ngram_size, h.heads_per_ngram = f.heads_per_ngram, h.eos = c.eos_token_ids[0];
  h.multipliers = read(m, f.ngram_size);
  h.offsets = read(o, f.ple_heads());
  h.sizes = read(v, f.ple_heads());
  return true;
}

class FlashNextLM final : public HybridDecoderLM {
 public:
  FlashNextLM(const WeightLoader& w, const ModelConfig& c, DType dt)
      : HybridDecoderLM(w, c, dt, HybridOptions{/*gated_attention=*/true, /*one_plus_norm=*/true, /*hyper_connections=*/true}) {
    RV_CHECK_ARG(!w.tensor_parallel(), c.architecture, ": tensor_parallel_size > 1 is not supported for Flash-Next yet");
    const FlashNextConfig& f = cfg_.flash;
    const int64_t E = cfg_.hidden_size, hcE = int64_t(f.hc_count) * E;
    size_t buffer = 0;
    for (int32_t l = 0; l < cfg_.num_layers; ++l) {
      const std::string p = prefix_ + "layers." + std::to_string(l) + ".";
      FlashLayer L;
      L.attn_hc = load_hc(w, p + "attn_hyper_connection.", true);
      L.mlp_hc = load_hc(w, p + "mlp_hyper_connection.", true);
      if (!layers_[size_t(l)].linear && f.indexer_ratio > 0) {
        const std::string q = p + "self_attn.indexer.";
        const int64_t D = f.indexer_head_dim;
        L.indexer.proj = w.get_linear(q + "index_qk_proj.weight", {(f.indexer_heads + 1) * D, E}, dtype_);
        L.indexer.q_norm = norm_weight(w, q + "q_layernorm.weight", D);
        L.indexer.k_norm = norm_weight(w, q + "k_layernorm.weight", D);
        bytes_ += int64_t(L.indexer.proj.nbytes());
      }
      if (f.is_ple_layer(l)) {
        L.has_ple = true;
        L.ple = load_ple(w, p + "ple.", int32_t(buffer / 2), hcE);
        L.ple.window_buffer = buffer++, L.ple.conv_buffer = buffer++;
      }
      flash_.push_back(std::move(L));
    }
    if (buffer > 0) ple_kept_.resize(flash_.size());
    mixer_ = load_hc(w, prefix_ + "hyper_connection_mixer.", false);
  }

  CacheSpecs cache_specs() const override { return cache_specs_for(cfg_); }

  // Decode steps are recorded as graphs: PLE's gather is a host stage in them (DeviceRuntime::
  // host_stage) and QSA reads the runner's device metadata. A verify step keeps its tokens for
  // PLE's replay on the host, so it is not recorded where the model has PLE.
  bool captures_verify_steps() const override { return ple_kept_.empty(); }

  ForwardOutput forward(const ForwardBatch& b, ModelCaches& caches) override {
    const FlashNextConfig& f = cfg_.flash;
    const int64_t T = b.token_ids.numel(), E = cfg_.hidden_size, hc = f.hc_count;
    const Device dev = device_;
    // Every stream starts as the token's embedding.
    Tensor x0 = Tensor::uninitialized({T, E}, DType::kF32, dev);
    ops::embedding(b.token_ids, head_.embed, x0);
    Tensor streams = Tensor::uninitialized({T, hc * E}, DType::kF32, dev);
    Tensor stream_rows = streams.view({T * hc, E});
    ops::gather_rows(x0, stream_sources(T * hc), stream_rows);
    // Each PLE layer's rows are gathered from the host table (on another thread for a large step)
    // while the layers before it run (queued on the device, or computed here on the CPU).
    std::vector<std::future<Tensor>> rows(layers_.size());
    if (b.kept_rows.defined() && !ple_kept_.empty()) keep_tokens(b);
    const bool graph = b.attention.decode_only && dev != Device::kCPU;  // no host round trip but a host stage
    for (size_t l = 0; l < layers_.size(); ++l)
      if (flash_[l].has_ple) rows[l] = graph ? staged_ple_rows(l, b, *caches.state, T) : fetch_ple_rows(flash_[l].ple, b, *caches.state, T);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& L = layers_[l];
      const FlashLayer& F = flash_[l];
      if (F.has_ple) ple(F.ple, rows[l].get(), b, *caches.state, streams, ple_kept_[l]);
      Tensor logits;
      Tensor x = mix(F.attn_hc, streams, &logits);
      Tensor y = L.linear ? deltanet_sigmoid(L, b, *caches.state, x) : indexed_attention(L, F.indexer, b, *caches.kv, x);
      ops::hc_combine(streams, y, logits, cfg_.flash.hc_lowrank, 1.0f / float(hc));
      x = mix(F.mlp_hc, streams, &logits);
      y = ffn(L.ffn, x);
      ops::hc_combine(streams, y, logits, cfg_.flash.hc_lowrank, 1.0f / float(hc));
    }
    Tensor x = mix(mixer_, streams, nullptr);
    return final_outputs(x, b, head_);
  }

  void replay_states(const Tensor& rows, const Tensor& seq_starts, const Tensor& seq_slots, ModelCaches& caches) override {
    if (cfg_.num_linear_layers() > 0) HybridDecoderLM::replay_states(rows, seq_starts, seq_slots, caches);
    if (ple_kept_.empty()) return;
    const FlashNextConfig& f = cfg_.flash;
    const int64_t R = rows.numel();
    const Tensor picked = rows.to(Device::kCPU);
    Tensor ids = Tensor::uninitialized({R}, DType::kI32);
    for (int64_t i = 0; i < R; ++i) ids.ptr<int32_t>()[i] = kept_tokens_.ptr<int32_t>()[picked.ptr<int32_t>()[i]];
    ids = ids.to(device_);
    StateCache& states = *caches.state;
    for (size_t l = 0; l < flash_.size(); ++l) {
      if (!flash_[l].has_ple) continue;
      const Ple& e = flash_[l].ple;
      RV_CHECK(ple_kept_[l].defined(), "replay_states: the last forward kept no PLE rows");
      Tensor unused = Tensor::uninitialized({R, f.ple_heads()}, DType::kI32, device_);
      ops::ngram_rows(ids, e.hash, states.buffers[e.window_buffer], seq_starts, seq_slots, unused);
      Tensor x = Tensor::uninitialized({R, ple_kept_[l].size(1)}, DType::kF32, device_);
      ops::gather_rows(ple_kept_[l], rows, x);
      Tensor out = Tensor::uninitialized(x.shape(), DType::kF32, device_);
      ops::causal_conv1d(x, e.conv, states.buffers[e.conv_buffer], seq_starts, seq_slots, out, true);
    }
  }

  void place(Device device) override {
    if (device == device_) return;
    auto move = [&](Tensor& t) {
      if (t.defined()) t = t.to(device);
    };
    for (FlashLayer& L : flash_) {
      for (HyperConnection* h : {&L.attn_hc, &L.mlp_hc}) move(h->norm), move(h->down_inject), move(h->up);
      move(L.indexer.proj), move(L.indexer.q_norm), move(L.indexer.k_norm);
      for (Tensor* t : {&L.ple.key, &L.ple.value, &L.ple.norm_key, &L.ple.norm_query, &L.ple.norm_conv,
                        &L.ple.conv, &L.ple.hash.multipliers, &L.ple.hash.sizes, &L.ple.hash.offsets})
        move(*t);
    }
    move(mixer_.norm), move(mixer_.down_inject), move(mixer_.up);
    HybridDecoderLM::place(device);
  }

 private:
  HyperConnection load_hc(const WeightLoader& w, const std::string& p, bool inject) {
    const FlashNextConfig& f = cfg_.flash;
    const int64_t hcE = int64_t(f.hc_count) * cfg_.hidden_size, r = f.hc_lowrank;
    HyperConnection h;
    h.norm = norm_weight(w, p + "hc_norm.weight", hcE);
    h.down_inject = inject ? w.get_stacked_linear({p + "input_mix_weight_down.weight", p + "block_inject_weight.weight"},
                                                  {{r, hcE}, {f.hc_count, hcE}}, dtype_)
                           : w.get_linear(p + "input_mix_weight_down.weight", {r, hcE}, dtype_);
    h.up = w.get_linear(p + "input_mix_weight_up.weight", {hcE, r}, dtype_);
    bytes_ += int64_t(h.down_inject.nbytes() + h.up.nbytes());
    return h;
  }

  Ple load_ple(const WeightLoader& w, const std::string& p, int32_t ple_index, int64_t hcE) {
    const FlashNextConfig& f = cfg_.flash;
    const int64_t E = cfg_.hidden_size, P = f.ple_embed_dim, hd = P / f.ple_heads();
    Ple e;
    int64_t rows = 0;
    const bool stored = stored_ngram_hash(w, cfg_, p + "ple_embedding.", e.hash);
    if (!stored) e.hash = derived_ngram_hash(cfg_, ple_index, rows);
    // The table: one tensor, or the shards its checkpoint splits it into (by rows).
    const std::string whole = p + "ple_embedding.ngram_embedding.weight";
    std::vector<std::string> names;
    const auto shard = [&](int32_t i) { return p + "ple_embedding.ngram_embedding.shard_" + std::to_string(i) + ".weight"; };
    if (w.has(whole)) names.push_back(whole);
    else
      for (int32_t i = 0; w.has(shard(i)); ++i) names.push_back(shard(i));
    RV_CHECK(!names.empty(), "model: missing tensor ", whole, " (or its shards)");
    if (stored) {  // the table as stored, which must hold every head's rows
      rows = 0;
      for (const std::string& n : names) rows += w.shape(n).at(0);
      const int64_t* off = e.hash.offsets.ptr<int64_t>();
      const int64_t* size = e.hash.sizes.ptr<int64_t>();
      for (int32_t i = 0; i < f.ple_heads(); ++i)
        RV_CHECK(off[i] >= 0 && size[i] > 0 && off[i] + size[i] <= rows, "model: PLE head ", i, " takes rows [", off[i],
                 ", ", off[i] + size[i], ") of a table of ", rows);
    }
    e.table = PleTable(w, names, rows, hd, dtype_, f.ple_on_disk);
    e.key = w.get_linear(p + "key_proj.weight", {hcE, P}, dtype_);
    e.value = w.get_linear(p + "value_proj.weight", {E, P}, dtype_);
    e.norm_key = norm_weight(w, p + "norm_key.weight", hcE);
    e.norm_query = norm_weight(w, p + "norm_query.weight", hcE);
    e.norm_conv = norm_weight(w, p + "norm_conv.weight", hcE);
    // The dilated conv as an undilated one whose taps between the dilation's are zero.
    const int64_t K = f.ple_conv_kernel, n = f.ngram_size, width = (K - 1) * n + 1;
    const Tensor conv = w.get(p + "conv1d.weight", {hcE, 1, K}, DType::kF32, kHost);
    e.conv = Tensor::empty({hcE, width}, DType::kF32);
    for (int64_t c = 0; c < hcE; ++c)
      for (int64_t k = 0; k < K; ++k) e.conv.ptr<float>()[c * width + k * n] = conv.ptr<float>()[c * K + k];
    bytes_ += int64_t(e.key.nbytes() + e.value.nbytes());  // (the table is off the device: not counted)
    return e;
  }

  // The mix before a block (x [T, E]); logits: [T, rank + hc], the inject logits after the rank.
  Tensor mix(const HyperConnection& h, const Tensor& streams, Tensor* logits) {
    const int64_t T = streams.size(0), E = cfg_.hidden_size, r = cfg_.flash.hc_lowrank;
    const float eps = cfg_.rms_norm_eps, inv_hc = 1.0f / float(cfg_.flash.hc_count);
    const Device dev = streams.device();
    Tensor normed = Tensor::uninitialized(streams.shape(), DType::kF32, dev);
    ops::group_rms_norm(streams, h.norm, E, eps, normed);
    Tensor low = project(normed, h.down_inject), act = Tensor::uninitialized({T, r}, DType::kF32, dev);
    ops::scaled_silu(low, r, inv_hc, act);
    Tensor mix_logits = project(act, h.up), x = Tensor::uninitialized({T, E}, DType::kF32, dev);
    ops::hc_mix(normed, mix_logits, x);
    if (logits) *logits = low;
    return x;
  }

  // Row t * hc + c of the streams is token t's: the source rows of the first streams, on the device,
  // made for at least a long step's tokens so that a recorded step never makes them.
  Tensor stream_sources(int64_t n) {
    if (rep_.numel() < n) {
      const int64_t hc = cfg_.flash.hc_count, size = std::max<int64_t>(n, 8192 * hc);
      Tensor rep = Tensor::uninitialized({size}, DType::kI32);
      for (int64_t i = 0; i < size; ++i) rep.ptr<int32_t>()[i] = int32_t(i / hc);
      rep_ = rep.to(device_);
    }
    return rep_.slice_rows(0, n);
  }

  // Pinned buffers of one recorded step's PLE gather, and what its host stage reads.
  struct PleStage {
    const PleTable* table = nullptr;
    std::shared_ptr<void> ids, rows;
    int64_t count = 0;
    static void run(void* p) {
      auto* s = static_cast<PleStage*>(p);
      s->table->gather(static_cast<const int32_t*>(s->ids.get()), s->count, static_cast<float*>(s->rows.get()));
    }
  };

  // A recorded step's rows: n-gram ids down, the gather on a runtime thread, rows up, all in the
  // device's work order (each graph keeps its own stage: its pinned buffers are in the graph).
  std::future<Tensor> staged_ple_rows(size_t layer, const ForwardBatch& b, StateCache& states, int64_t T) {
    const Ple& e = flash_[layer].ple;
    const int64_t heads = cfg_.flash.ple_heads(), hd = cfg_.flash.ple_embed_dim / heads, n = T * heads;
    Tensor ids = Tensor::uninitialized({T, heads}, DType::kI32, device_);
    ops::ngram_rows(b.token_ids, e.hash, states.buffers[e.window_buffer], b.seq_starts, b.seq_state_slots, ids);
    std::unique_ptr<PleStage>& stage = ple_stages_[{layer, T}];
    DeviceRuntime& rt = device_runtime(device_);
    if (!stage) {
      stage = std::make_unique<PleStage>();
      stage->table = &e.table, stage->count = n;
      stage->ids = rt.pinned_host(size_t(n) * 4), stage->rows = rt.pinned_host(size_t(n * hd) * 4);
    }
    Tensor emb = Tensor::uninitialized({n, hd}, DType::kF32, device_);
    rt.host_stage(ids.data(), stage->ids.get(), size_t(n) * 4, &PleStage::run, stage.get(), stage->rows.get(), emb.data(),
                  size_t(n * hd) * 4);
    std::promise<Tensor> ready;
    ready.set_value(emb);
    return ready.get_future();
  }

  // The step's table rows [T * heads, hd] in host memory, gathered on another thread when large. The n-gram
  // ids come first (they advance the layer's window state, which nothing before it reads), then one
  // copy of them down; the table is off the device.
  std::future<Tensor> fetch_ple_rows(const Ple& e, const ForwardBatch& b, StateCache& states, int64_t T) {
    const FlashNextConfig& f = cfg_.flash;
    const int64_t heads = f.ple_heads(), hd = f.ple_embed_dim / heads;
    Tensor rows = Tensor::uninitialized({T, heads}, DType::kI32, b.token_ids.device());
    ops::ngram_rows(b.token_ids, e.hash, states.buffers[e.window_buffer], b.seq_starts, b.seq_state_slots, rows);
    Tensor ids = rows.view({T * heads}).to(Device::kCPU);
    // A thread only where the gather outweighs starting one (a decode step of a few tokens gathers
    // in microseconds): below 256 KB of rows it runs when the PLE layer asks for them.
    const auto policy = ids.numel() * hd * 4 >= (int64_t(256) << 10) ? std::launch::async : std::launch::deferred;
    return std::async(policy, [&table = e.table, ids, hd] {
      Tensor emb = Tensor::uninitialized({ids.numel(), hd}, DType::kF32);
      table.gather(ids.ptr<int32_t>(), ids.numel(), emb.ptr<float>());
      return emb;
    });
  }

  // The tokens of a verify step's kept rows, on the host (PLE's window replays through them).
  void keep_tokens(const ForwardBatch& b) {
    const Tensor ids = b.token_ids.to(Device::kCPU), rows = b.kept_rows.to(Device::kCPU);
    kept_tokens_ = Tensor::uninitialized({rows.numel()}, DType::kI32);
    for (int64_t i = 0; i < rows.numel(); ++i) kept_tokens_.ptr<int32_t>()[i] = ids.ptr<int32_t>()[rows.ptr<int32_t>()[i]];
  }

  // kept: the conv's input rows of a verify step's kept rows, for replay_states.
  void ple(const Ple& e, const Tensor& emb, const ForwardBatch& b, StateCache& states, Tensor& streams, Tensor& kept) {
    const FlashNextConfig& f = cfg_.flash;
    const int64_t T = streams.size(0), E = cfg_.hidden_size;
    const float eps = cfg_.rms_norm_eps;
    const Device dev = streams.device();
    const Tensor embedded = emb.to(dev).view({T, f.ple_embed_dim});
    Tensor key = project(embedded, e.key), value = project(embedded, e.value);
    ops::group_rms_norm(key, e.norm_key, E, eps, key);
    Tensor query = Tensor::uninitialized(streams.shape(), DType::kF32, dev);
    ops::group_rms_norm(streams, e.norm_query, E, eps, query);
    Tensor gated = Tensor::uninitialized(streams.shape(), DType::kF32, dev);
    ops::ple_gate(key, query, value, gated);
    ops::group_rms_norm(gated, e.norm_conv, E, eps, query);  // (query's storage reused)
    if (b.kept_rows.defined()) {
      kept = Tensor::uninitialized({b.kept_rows.numel(), query.size(1)}, DType::kF32, dev);
      ops::gather_rows(query, b.kept_rows, kept);
    }
    Tensor conv = Tensor::uninitialized(streams.shape(), DType::kF32, dev);
    ops::causal_conv1d(query, e.conv, states.buffers[e.conv_buffer], b.seq_starts, b.seq_state_slots, conv, true);
    ops::accumulate(streams, gated);
    ops::accumulate(streams, conv);
  }

  // Gated attention whose queries read only the cells QSA keeps (all cells without an indexer).
  Tensor indexed_attention(const Layer& L, const Indexer& ix, const ForwardBatch& b, KvCache& kv, const Tensor& x) {
    const FlashNextConfig& f = cfg_.flash;
    const int64_t T = x.size(0), D = cfg_.head_dim, NH = cfg_.num_heads, KVH = cfg_.num_kv_heads, QO = NH * D;
    const float eps = cfg_.rms_norm_eps, scale = 1.0f / std::sqrt(float(D));
    const Device dev = x.device();
    const size_t layer = size_t(L.cache_index);
    Tensor fused = project(x, L.attn.proj);
    Tensor q = Tensor::uninitialized({T, NH, D}, DType::kF32, dev), attn = Tensor::uninitialized({T, NH, D}, DType::kF32, dev);
    const ops::QkNorm norm{&L.attn.q_norm, &L.attn.k_norm, eps};
    ops::qkv_rope_cache(fused, norm, b.positions, rope_, b.slot_mapping, q, kv.k[layer], kv.v[layer], kv.quant_of(layer));
    const ops::OutputGate gate{&fused, QO + 2 * KVH * D};
    if (!ix.proj.defined()) {
      ops::paged_attention(q, kv.k[layer], kv.v[layer], b.attention, scale, attn, &gate, kv.quant_of(layer));
      return project(attn.view({T, QO}), L.attn.o);
    }
    const int64_t IH = f.indexer_heads, ID = f.indexer_head_dim;
    Tensor qk = project(x, ix.proj);
    Tensor iq = Tensor::uninitialized({T, IH, ID}, DType::kF32, dev), raw = Tensor::uninitialized({T, ID}, DType::kF32, dev);
    Tensor iq2 = iq.view({T, IH * ID});
    ops::copy_columns(qk, 0, iq2);
    ops::copy_columns(qk, IH * ID, raw);
    ops::rms_norm(iq, ix.q_norm, eps, iq);
    ops::rope(iq, b.positions, rope_);
    ops::token_rows_write(raw, b.slot_mapping, kv.rows[layer]);
    Tensor blocks = Tensor::uninitialized({T, f.top_blocks()}, DType::kI32, dev);
    ops::qsa_select(iq, kv.rows[layer], ops::QsaIndex{&ix.k_norm, &rope_, eps, f.indexer_ratio}, b.attention, blocks);
    ops::qsa_attention(q, kv.k[layer], kv.v[layer], b.attention, blocks, f.indexer_ratio, scale, attn, &gate,
                       kv.quant_of(layer));
    return project(attn.view({T, QO}), L.attn.o);
  }

  // The DeltaNet block with its output gate as the config names it (Flash-Next: sigmoid).
  Tensor deltanet_sigmoid(const Layer& L, const ForwardBatch& b, StateCache& states, const Tensor& x) {
    if (!cfg_.flash.sigmoid_output_gate) return deltanet(L, b, states, x);
    const ModelConfig& c = cfg_;
    const int64_t T = x.size(0), Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
    const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim;
    const int64_t value_dim = Hv * Dv, conv_dim = 2 * Hk * Dk + value_dim;
    const Device dev = x.device();
    const size_t layer = size_t(L.cache_index);
    Tensor fused = project(x, L.gdn.proj);
    keep_inputs(L, b, fused);  // (the state update does not depend on the output gate)
    Tensor conv_out = Tensor::uninitialized({T, conv_dim}, DType::kF32, dev);
    Tensor g = Tensor::uninitialized({T, Hv}, DType::kF32, dev), beta = Tensor::uninitialized({T, Hv}, DType::kF32, dev);
    ops::gdn_gates(fused, conv_dim + value_dim, L.gdn.neg_a, L.gdn.dt_bias, beta, g);
    Tensor q = Tensor::uninitialized({T, Hk, Dk}, DType::kF32, dev), k = Tensor::uninitialized({T, Hk, Dk}, DType::kF32, dev);
    Tensor v = Tensor::uninitialized({T, Hv, Dv}, DType::kF32, dev), core = Tensor::uninitialized({T, Hv, Dv}, DType::kF32, dev);
    ops::causal_conv1d(fused, L.gdn.conv, states.conv[layer], b.seq_starts, b.seq_state_slots, conv_out, true);
    ops::gdn_split_qkv(conv_out, 1e-6f, q, k, v);
    ops::gated_delta_rule(q, k, v, g, beta, states.ssm[layer], b.seq_starts, b.seq_state_slots, core, kChunk);
    ops::rms_norm(core, L.gdn.norm, c.rms_norm_eps, core);
    Tensor normed = core.view({T, value_dim});
    ops::sigmoid_mul(normed, fused, conv_dim);  // z: columns of the projection
    return project(normed, L.gdn.out);
  }

  Tensor ffn(const FeedForwardWeights& f, const Tensor& x) {
    const int64_t T = x.size(0);
    if (!f.moe) {
      Tensor y = Tensor::uninitialized({T, cfg_.hidden_size}, DType::kF32, x.device());
      mlp(f.gate_up, f.down, x, y);
      return y;
    }
    const int64_t K = cfg_.num_experts_per_tok + (f.shared_routed ? 1 : 0);
    Tensor ids = Tensor::uninitialized({T, K}, DType::kI32, x.device()), weights = Tensor::uninitialized({T, K}, DType::kF32, x.device());
    ops::moe_route(x, f.router, cfg_.num_experts, cfg_.norm_topk_prob, ids, weights, nullptr);
    return experts_output(f, x, ids, weights);
  }

  std::vector<FlashLayer> flash_;
  HyperConnection mixer_;
  std::vector<Tensor> ple_kept_;  // per layer (PLE layers only): its conv's kept input rows
  Tensor kept_tokens_;            // the last verify step's kept tokens, on the host
  Tensor rep_;                    // stream_sources
  std::map<std::pair<size_t, int64_t>, std::unique_ptr<PleStage>> ple_stages_;  // by (layer, step tokens)
};

}  // namespace

std::unique_ptr<CausalLM> make_flash_next(const WeightLoader& w, const ModelConfig& c, DType dt) {
  return std::make_unique<FlashNextLM>(w, c, dt);
}

}  // namespace revolta
