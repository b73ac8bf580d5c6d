#include "spec/dflash_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "core/json.h"

namespace revolta {
namespace {

Json read_json(const std::string& path) {
  std::ifstream f(path);
  RV_CHECK(f.good(), "cannot read ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return Json::parse(ss.str());
  } catch (const std::exception& e) {
    throw std::runtime_error(str_cat(path, ": ", e.what()));
  }
}

// The `dflash` package's default taps: one target layer per draft layer, spread over [1, n - 3]
// (Python's round: half to even).
std::vector<int32_t> default_target_layers(int32_t target_layers, int32_t draft_layers) {
  if (draft_layers == 1) return {target_layers / 2};
  const double start = 1.0, span = double(target_layers - 3) - start;
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < draft_layers; ++i) ids.push_back(int32_t(std::nearbyint(start + i * span / (draft_layers - 1))));
  return ids;
}

}  // namespace

DFlashConfig DFlashConfig::from_dir(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const Json j = read_json(path);
  const auto& archs = j["architectures"];
  RV_CHECK(archs.is_array() && !archs.as_array().empty(), path, ": config has no 'architectures' entry");
  const std::string arch = archs.as_array()[0].as_string();
  RV_CHECK_ARG(arch == "DFlashDraftModel" || arch == "DFlash2DraftModel", path, ": architecture ", arch,
               " is not a DFlash draft (DFlashDraftModel, DFlash2DraftModel)");
  const Json& types = j["layer_types"];
  if (types.is_array())
    for (const Json& t : types.as_array())
      RV_CHECK_ARG(t.as_string() == "full_attention", path, ": layer_types '", t.as_string(),
                   "' (sliding-window draft layers) are not supported yet");
  DFlashConfig c;
  c.layers = ModelConfig::from_json_fields(j, path, arch);
  // The package reads a field from dflash_config first, then from the config itself.
  const Json& block = j["dflash_config"];
  const auto field = [&](const char* key) -> const Json& { return block.is_object() && block.contains(key) ? block[key] : j[key]; };
  const auto number = [&](const char* key, double def) { return field(key).is_number() ? field(key).as_number() : def; };
  const Json& ids = field("target_layer_ids");
  if (ids.is_array()) {
    for (const Json& v : ids.as_array()) c.target_layer_ids.push_back(int32_t(v.as_int()));
  } else {
    RV_CHECK_ARG(j["num_target_layers"].is_number(), path, ": neither target_layer_ids nor num_target_layers is set");
    c.target_layer_ids = default_target_layers(int32_t(j["num_target_layers"].as_int()), c.layers.num_layers);
  }
  RV_CHECK_ARG(!c.target_layer_ids.empty(), path, ": target_layer_ids is empty");
  c.block_size = int32_t(number("block_size", 16));
  RV_CHECK_ARG(field("mask_token_id").is_number(), path, ": mask_token_id is not set");
  c.mask_token_id = int32_t(field("mask_token_id").as_int());
  c.input_embedding_scale = float(number("input_embedding_scale", 1.0));
  c.output_multiplier = float(number("output_multiplier", 1.0));
  c.logit_softcap = float(number("final_logit_softcapping", 0.0));
  if (arch == "DFlash2DraftModel") {
    for (const char* key : {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"})
      RV_CHECK_ARG(field(key).is_number() && field(key).as_int() > 0, path, ": DFlash2 needs a positive ", key);
    c.conv_kernel_size = int32_t(field("conv_kernel_size").as_int());
    c.conv_group_size = int32_t(field("conv_group_size").as_int());
    c.selector_rank = int32_t(field("selector_rank").as_int());
    c.selector_top_k = int32_t(field("selector_top_k").as_int());
    RV_CHECK_ARG(c.layers.hidden_size % c.conv_group_size == 0, path, ": conv_group_size ", c.conv_group_size,
                 " does not divide hidden_size ", c.layers.hidden_size);
  }
  RV_CHECK_ARG(!j.get_bool("is_causal", false), path, ": a causal draft block (is_causal) is not supported");
  RV_CHECK_ARG(!c.layers.attention_bias, path, ": attention_bias is not supported for DFlash drafts");
  return c;
}

DFlashDraft::DFlashDraft(const WeightLoader& w, const DFlashConfig& c, int32_t max_positions, DType dt, Device device)
    : cfg_(c), dtype_(dt), device_(device) {
  const ModelConfig& m = c.layers;
  const int64_t H = m.hidden_size, D = m.head_dim, NH = m.num_heads, KVH = m.num_kv_heads, I = m.intermediate_size;
  fc_ = w.get_linear("fc.weight", {H, int64_t(c.target_layer_ids.size()) * H}, dt);
  hidden_norm_ = w.get("hidden_norm.weight", {H}, DType::kF32);
  norm_ = w.get("norm.weight", {H}, DType::kF32);
  for (int32_t l = 0; l < m.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    Layer L;
    L.input_norm = w.get(p + "input_layernorm.weight", {H}, DType::kF32);
    L.post_norm = w.get(p + "post_attention_layernorm.weight", {H}, DType::kF32);
    const std::string a = p + "self_attn.";
    L.qkv = w.get_stacked_linear({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                                 {{NH * D, H}, {KVH * D, H}, {KVH * D, H}}, dt);
    L.o = w.get_linear(a + "o_proj.weight", {H, NH * D}, dt);
    L.q_norm = w.get(a + "q_norm.weight", {D}, DType::kF32);
    L.k_norm = w.get(a + "k_norm.weight", {D}, DType::kF32);
    L.gate_up = w.get_stacked_linear({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, {{I, H}, {I, H}}, dt);
    L.down = w.get_linear(p + "mlp.down_proj.weight", {H, I}, dt);
    if (c.dflash2()) L.attn_conv = load_conv(w, p + "attention_conv."), L.mlp_conv = load_conv(w, p + "mlp_conv.");
    layers_.push_back(std::move(L));
  }
  if (c.dflash2()) {  // released checkpoints name the codebooks without ".weight"
    const auto book = [&](const std::string& name) {
      const std::string n = "candidate_selector." + name;
      return w.get(w.has(n) ? n : n + ".weight", {m.vocab_size, c.selector_rank}, DType::kF32, Device::kCPU);
    };
    predecessor_ = book("predecessor_codebook");
    successor_ = book("successor_codebook");
    selector_projection_ = w.get("candidate_selector.hidden_projection.weight", {c.selector_rank, H}, DType::kF32,
                                 Device::kCPU);
  }
  rope_ = build_rope_tables(m.rope, D, max_positions);
  rope_.cos = rope_.cos.to(device), rope_.sin = rope_.sin.to(device);
}

DFlashDraft::Conv DFlashDraft::load_conv(const WeightLoader& w, const std::string& p) {
  const int64_t H = cfg_.layers.hidden_size, K = cfg_.conv_kernel_size, G = H / cfg_.conv_group_size;
  Conv conv;
  conv.base = w.get(p + "base_kernel", {2, K, H}, DType::kF32).view({2 * K, H});
  conv.projection = w.get_linear(p + "kernel_projection.weight", {2 * K * G, H}, dtype_);
  return conv;
}

Tensor DFlashDraft::convolve(const Conv& conv, int part, const Tensor& x, const Tensor& dynamic,
                             const Tensor& first_row) const {
  const int64_t K = cfg_.conv_kernel_size, G = cfg_.layers.hidden_size / cfg_.conv_group_size;
  Tensor out = Tensor::uninitialized(x.shape(), DType::kF32, device_);
  ops::dynamic_conv(x, dynamic, part * K * G, G, conv.base.slice_rows(part * K, (part + 1) * K), first_row, out);
  return out;
}

Tensor DFlashDraft::forward(const DFlashInputs& in, KvCache& kv, int32_t first_layer) {
  const ModelConfig& m = cfg_.layers;
  const int64_t C = in.context.defined() ? in.context.size(0) : 0, R = in.noise.size(0);
  const int64_t H = m.hidden_size, D = m.head_dim, NH = m.num_heads, KVH = m.num_kv_heads;
  const float eps = m.rms_norm_eps;
  RV_CHECK(first_layer >= 0 && size_t(first_layer) + layers_.size() <= kv.k.size(), "DFlash draft: cache layers [",
           first_layer, ", ", first_layer + num_layers(), ") of ", kv.k.size());
  // Rows [context | block]: the context rows keep the fused target features in every layer, the
  // block rows take each layer's normalised input.
  Tensor x = Tensor::uninitialized({C + R, H}, DType::kF32, device_);
  Tensor block = x.slice_rows(C, C + R);
  if (C > 0) {
    Tensor fused = Tensor::uninitialized({C, H}, DType::kF32, device_);
    ops::linear(in.context, fc_, nullptr, fused);
    Tensor ctx = x.slice_rows(0, C);
    ops::rms_norm(fused, hidden_norm_, eps, ctx);
  }
  const auto joined = [&](const Tensor& a, const Tensor& b) {  // int32 [C] then [R], on the host first
    Tensor t = Tensor::empty({C + R}, DType::kI32);
    if (C > 0) std::copy_n(a.to(Device::kCPU).ptr<int32_t>(), C, t.ptr<int32_t>());
    std::copy_n(b.to(Device::kCPU).ptr<int32_t>(), R, t.ptr<int32_t>() + C);
    return t.to(device_);
  };
  const Tensor positions = joined(in.context_positions, in.block_positions);
  const Tensor slots = joined(in.context_slots, in.block_slots);
  const Tensor first_row = cfg_.dflash2() ? in.first_row.to(device_) : Tensor();

  Tensor residual = Tensor::uninitialized({R, H}, DType::kF32, device_);
  ops::copy_columns(in.noise.to(device_), 0, residual);
  ops::rms_norm(residual, layers_[0].input_norm, eps, block);
  Tensor qkv = Tensor::uninitialized({C + R, (NH + 2 * KVH) * D}, DType::kF32, device_);
  Tensor q = Tensor::uninitialized({C + R, NH, D}, DType::kF32, device_);
  Tensor attn = Tensor::uninitialized({R, NH, D}, DType::kF32, device_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    Tensor& kc = kv.k[size_t(first_layer) + l];
    Tensor& vc = kv.v[size_t(first_layer) + l];
    Tensor dynamic;
    if (cfg_.dflash2()) {  // the conv before attention replaces the block rows' input
      dynamic = Tensor::uninitialized({R, L.attn_conv.projection.size(0)}, DType::kF32, device_);
      ops::linear(block, L.attn_conv.projection, nullptr, dynamic);
      ops::copy_columns(convolve(L.attn_conv, 0, block, dynamic, first_row), 0, block);
    }
    ops::linear(x, L.qkv, nullptr, qkv);
    ops::qkv_rope_cache(qkv, ops::QkNorm{&L.q_norm, &L.k_norm, eps}, positions, rope_, slots, q, kc, vc);
    ops::paged_attention(q.slice_rows(C, C + R), kc, vc, in.attention, 1.0f / std::sqrt(float(D)), attn);
    Tensor o = Tensor::uninitialized({R, H}, DType::kF32, device_);
    ops::linear(attn.view({R, NH * D}), L.o, nullptr, o);
    if (cfg_.dflash2()) o = convolve(L.attn_conv, 1, o, dynamic, first_row);
    ops::add_rms_norm(residual, o, L.post_norm, eps, block);
    Tensor mlp_in = block;
    if (cfg_.dflash2()) {
      dynamic = Tensor::uninitialized({R, L.mlp_conv.projection.size(0)}, DType::kF32, device_);
      ops::linear(block, L.mlp_conv.projection, nullptr, dynamic);
      mlp_in = convolve(L.mlp_conv, 0, block, dynamic, first_row);
    }
    Tensor act = Tensor::uninitialized({R, L.down.size(1)}, DType::kF32, device_);
    ops::linear_swiglu(mlp_in, L.gate_up, act);
    Tensor y = Tensor::uninitialized({R, H}, DType::kF32, device_);
    ops::linear(act, L.down, nullptr, y);
    if (cfg_.dflash2()) y = convolve(L.mlp_conv, 1, y, dynamic, first_row);
    ops::add_rms_norm(residual, y, l + 1 < layers_.size() ? layers_[l + 1].input_norm : norm_, eps, block);
  }
  return block;
}

Tensor DFlashDraft::logits(const Tensor& hidden, const Tensor& lm_head) const {
  Tensor out = Tensor::uninitialized({hidden.size(0), lm_head.size(0)}, DType::kF32, hidden.device());
  ops::linear(hidden, lm_head, nullptr, out);
  if (cfg_.output_multiplier == 1.0f && cfg_.logit_softcap <= 0.0f) return out;
  Tensor host = out.to(Device::kCPU);
  float* v = host.ptr<float>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    v[i] *= cfg_.output_multiplier;
    if (cfg_.logit_softcap > 0.0f) v[i] = std::tanh(v[i] / cfg_.logit_softcap) * cfg_.logit_softcap;
  }
  return host.to(hidden.device());
}

DFlashPath DFlashDraft::select(const Tensor& hidden, const Tensor& logits, int32_t anchor, float temperature,
                               const std::vector<float>& uniforms) const {
  RV_CHECK(cfg_.dflash2(), "DFlash draft: the candidate selector is DFlash2's");
  const Tensor h = hidden.to(Device::kCPU), lg = logits.to(Device::kCPU);
  const int64_t n = h.size(0), H = h.size(1), V = lg.size(1), rank = cfg_.selector_rank;
  const int64_t k = std::min<int64_t>(cfg_.selector_top_k, V);
  RV_CHECK(temperature <= 0.0f || int64_t(uniforms.size()) >= n, "DFlash draft: ", n, " uniforms needed");
  DFlashPath path;
  int32_t predecessor = anchor;
  std::vector<float> projected(static_cast<size_t>(rank)), scores(static_cast<size_t>(k));
  for (int64_t pos = 0; pos < n; ++pos) {
    const float* row = lg.ptr<float>() + pos * V;
    std::vector<int32_t> cand(static_cast<size_t>(V));
    std::iota(cand.begin(), cand.end(), 0);
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    cand.resize(size_t(k));
    const float* hr = h.ptr<float>() + pos * H;
    const float* pred = predecessor_.ptr<float>() + int64_t(predecessor) * rank;
    for (int64_t r = 0; r < rank; ++r) {  // predecessor code x the row's projection
      const float* wr = selector_projection_.ptr<float>() + r * H;
      float s = 0.0f;
      for (int64_t i = 0; i < H; ++i) s += wr[i] * hr[i];
      projected[size_t(r)] = s * pred[r];
    }
    for (int64_t j = 0; j < k; ++j) {
      const float* succ = successor_.ptr<float>() + int64_t(cand[size_t(j)]) * rank;
      float s = 0.0f;
      for (int64_t r = 0; r < rank; ++r) s += projected[size_t(r)] * succ[r];
      scores[size_t(j)] = row[cand[size_t(j)]] + s;
    }
    int64_t pick = std::max_element(scores.begin(), scores.end()) - scores.begin();
    if (temperature > 0.0f) {  // softmax(scores / T), drawn by the inverse CDF
      std::vector<float> q(static_cast<size_t>(k));
      const float top = scores[size_t(pick)];
      float total = 0.0f;
      for (int64_t j = 0; j < k; ++j) total += q[size_t(j)] = std::exp((scores[size_t(j)] - top) / temperature);
      for (float& v : q) v /= total;
      float acc = 0.0f;
      pick = k - 1;
      for (int64_t j = 0; j < k; ++j)
        if ((acc += q[size_t(j)]) > uniforms[size_t(pos)]) {
          pick = j;
          break;
        }
      path.q.push_back(std::move(q));
    }
    predecessor = cand[size_t(pick)];
    path.tokens.push_back(predecessor);
    path.candidates.push_back(std::move(cand));
  }
  return path;
}

}  // namespace revolta
