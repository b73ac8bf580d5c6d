#include "model/model_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace revolta {
namespace {

int32_t require_int(const Json& j, const char* key, const std::string& src) {
  RV_CHECK(j.contains(key) && j[key].is_number(), src, ": config field '", key,
           "' is missing or not a number");
  return int32_t(j[key].as_int());
}

std::vector<int32_t> int_or_list(const Json& v) {
  std::vector<int32_t> out;
  if (v.is_number()) out.push_back(int32_t(v.as_int()));
  else if (v.is_array())
    for (const auto& e : v.as_array()) out.push_back(int32_t(e.as_int()));
  return out;
}

RopeConfig parse_rope(const Json& j, int32_t max_pos) {
  RopeConfig r;
  // transformers 5 writes "rope_parameters"; 4.x wrote rope_theta + "rope_scaling".
  const Json& params = j.contains("rope_parameters") ? j["rope_parameters"] : j["rope_scaling"];
  r.theta = j.get_number("rope_theta", 10000.0);
  r.partial_rotary_factor = j.get_number("partial_rotary_factor", 1.0);
  if (params.is_object()) {
    r.type = params.get_string("rope_type", params.get_string("type", "default"));
    r.theta = params.get_number("rope_theta", r.theta);
    r.partial_rotary_factor = params.get_number("partial_rotary_factor", r.partial_rotary_factor);
    r.factor = params.get_number("factor", 1.0);
    r.low_freq_factor = params.get_number("low_freq_factor", 1.0);
    r.high_freq_factor = params.get_number("high_freq_factor", 4.0);
    double bf = params.get_number("beta_fast", 0.0), bs = params.get_number("beta_slow", 0.0);
    r.beta_fast = bf != 0.0 ? bf : 32.0;
    r.beta_slow = bs != 0.0 ? bs : 1.0;
    if (!params["attention_factor"].is_null()) r.attention_factor = params["attention_factor"].as_number();
    if (!params["mscale"].is_null()) r.mscale = params["mscale"].as_number();
    if (!params["mscale_all_dim"].is_null()) r.mscale_all_dim = params["mscale_all_dim"].as_number();
    r.truncate = params.get_bool("truncate", true);
    r.original_max_position_embeddings = params.get_int("original_max_position_embeddings", 0);
    if (params["mrope_section"].is_array()) r.mrope_section = int_or_list(params["mrope_section"]);
    r.mrope_interleaved = params.get_bool("mrope_interleaved", true);
  }
  if (j.contains("original_max_position_embeddings"))
    r.original_max_position_embeddings = j["original_max_position_embeddings"].as_int();
  if (r.original_max_position_embeddings == 0) r.original_max_position_embeddings = max_pos;
  RV_CHECK(r.type == "default" || r.type == "linear" || r.type == "llama3" || r.type == "yarn",
           "unsupported rope_type '", r.type, "' (supported: default, linear, llama3, yarn)");
  return r;
}

void parse_hybrid(const Json& j, ModelConfig& c) {
  c.num_experts = int32_t(j.get_int("num_experts", j.get_int("num_local_experts", 0)));
  c.num_experts_per_tok = int32_t(j.get_int("num_experts_per_tok", 0));
  c.moe_intermediate_size = int32_t(j.get_int("moe_intermediate_size", 0));
  c.shared_expert_intermediate_size = int32_t(j.get_int("shared_expert_intermediate_size", 0));
  c.decoder_sparse_step = int32_t(j.get_int("decoder_sparse_step", 1));
  // Multi-token-prediction layers the checkpoint carries (mtp.*; the two spellings in use).
  c.num_mtp_layers = int32_t(j.get_int("mtp_num_hidden_layers", j.get_int("num_nextn_predict_layers", 0)));
  c.norm_topk_prob = j.get_bool("norm_topk_prob", true);
  for (const auto& v : (j["mlp_only_layers"].is_array() ? j["mlp_only_layers"].as_array() : std::vector<Json>{}))
    c.mlp_only_layers.push_back(int32_t(v.as_int()));
  c.linear_num_key_heads = int32_t(j.get_int("linear_num_key_heads", 0));
  c.linear_num_value_heads = int32_t(j.get_int("linear_num_value_heads", 0));
  c.linear_key_head_dim = int32_t(j.get_int("linear_key_head_dim", 0));
  c.linear_value_head_dim = int32_t(j.get_int("linear_value_head_dim", 0));
  c.linear_conv_kernel_dim = int32_t(j.get_int("linear_conv_kernel_dim", 4));
  c.linear_layers.assign(size_t(c.num_layers), false);
  if (j["layer_types"].is_array()) {
    const auto& types = j["layer_types"].as_array();
    RV_CHECK(int32_t(types.size()) == c.num_layers, "layer_types has ", types.size(), " entries for ",
             c.num_layers, " layers");
    for (size_t i = 0; i < types.size(); ++i) {
      const std::string& t = types[i].as_string();
      // (Flash-Next's config names its QSA-indexed full-attention layers "indexed_attention")
      RV_CHECK(t == "linear_attention" || t == "full_attention" || t == "indexed_attention", "unsupported layer type '",
               t, "'");
      c.linear_layers[i] = t == "linear_attention";
    }
  } else if (j.contains("full_attention_interval")) {
    const int64_t every = j["full_attention_interval"].as_int();
    for (int32_t i = 0; i < c.num_layers; ++i) c.linear_layers[size_t(i)] = (i + 1) % every != 0;
  }
}

void parse_flash_next(const Json& j, ModelConfig& c, const std::string& src) {
  if (!j.contains("hc_count")) return;
  FlashNextConfig& f = c.flash;
  f.hc_count = int32_t(j.get_int("hc_count", 0));
  f.hc_lowrank = int32_t(j.get_int("hc_lowrank", 0));
  RV_CHECK(f.hc_count >= 1 && f.hc_lowrank >= 1, src, ": hc_count (", f.hc_count, ") and hc_lowrank (", f.hc_lowrank,
           ") must be positive");
  f.indexer_heads = int32_t(j.get_int("indexer_n_heads", 0));
  f.indexer_head_dim = int32_t(j.get_int("indexer_head_dim", 0));
  f.indexer_budget = int32_t(j.get_int("indexer_budget", 0));
  f.indexer_ratio = f.indexer_heads > 0 ? int32_t(j.get_int("indexer_compress_ratio", 0)) : 0;
  RV_CHECK(j.get_int("indexer_kv_heads", 1) == 1, src, ": indexer_kv_heads must be 1 (one pooled key per block)");
  RV_CHECK(f.indexer_ratio == 0 || (f.indexer_head_dim > 0 && f.indexer_budget >= f.indexer_ratio), src,
           ": indexer_budget (", f.indexer_budget, ") must hold at least one block of indexer_compress_ratio (",
           f.indexer_ratio, ") tokens");
  for (const auto& v : (j["ple_layer_ids"].is_array() ? j["ple_layer_ids"].as_array() : std::vector<Json>{})) {
    const int64_t id = v.as_int();
    RV_CHECK(id >= 1 && id <= c.num_layers, src, ": ple_layer_ids entry ", id, " is not a layer (1..", c.num_layers, ")");
    f.ple_layers.push_back(int32_t(id - 1));
  }
  std::sort(f.ple_layers.begin(), f.ple_layers.end());
  f.ple_layers.erase(std::unique(f.ple_layers.begin(), f.ple_layers.end()), f.ple_layers.end());
  f.ngram_size = int32_t(j.get_int("ngram_size", 3));
  f.heads_per_ngram = int32_t(j.get_int("heads_per_ngram", 8));
  f.ple_conv_kernel = int32_t(j.get_int("ple_conv_kernel_size", 4));
  f.ple_embed_dim = int32_t(j["ple_embed_dim"].is_number() ? j["ple_embed_dim"].as_int() : c.hidden_size);
  f.ngram_vocab_base = j.get_int("ngram_vocab_size_base", 20000000);
  f.ngram_vocab_divisor = std::max<int64_t>(1, j.get_int("make_ngram_vocab_size_divisible_by", 128));
  f.seed = uint64_t(j.get_int("seed", 1234));
  if (!f.ple_layers.empty()) {
    RV_CHECK(f.ngram_size >= 2 && f.heads_per_ngram >= 1 && f.ple_conv_kernel >= 1, src, ": PLE needs ngram_size >= 2 (",
             f.ngram_size, "), heads_per_ngram >= 1 (", f.heads_per_ngram, ") and ple_conv_kernel_size >= 1 (",
             f.ple_conv_kernel, ")");
    RV_CHECK(f.ple_embed_dim % f.ple_heads() == 0, src, ": ple_embed_dim (", f.ple_embed_dim,
             ") must split over the (ngram_size - 1) * heads_per_ngram n-gram heads (", f.ple_heads(), ")");
    RV_CHECK(!c.eos_token_ids.empty(), src, ": PLE cuts its n-gram window at eos_token_id, which the config lacks");
  }
  const std::string gate = j.get_string("output_gate_type", c.hidden_act);
  RV_CHECK(gate == "sigmoid" || gate == "silu", src, ": output_gate_type '", gate, "' is not supported (sigmoid, silu)");
  f.sigmoid_output_gate = gate == "sigmoid";
}

}  // namespace

bool FlashNextConfig::is_ple_layer(int32_t layer) const {
  return std::find(ple_layers.begin(), ple_layers.end(), layer) != ple_layers.end();
}

bool ModelConfig::is_moe_layer(int32_t layer) const {
  if (num_experts <= 0) return false;
  for (int32_t l : mlp_only_layers)
    if (l == layer) return false;
  return (layer + 1) % std::max(1, decoder_sparse_step) == 0;
}

int32_t ModelConfig::num_linear_layers() const {
  int32_t n = 0;
  for (bool b : linear_layers) n += b;
  return n;
}

int32_t ModelConfig::num_attention_layers() const { return num_layers - num_linear_layers(); }

// The formats a checkpoint may declare; anything else is refused before any weight is read.
static WeightQuantization parse_quantization(const Json& j, const std::string& src) {
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return {};
  const Json& q = j["quantization_config"];
  std::string method = q.get_string("quant_method", "");
  for (char& ch : method) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (method == "fp8") return {"fp8", 128};  // HF's FP8: E4M3 weights, weight_scale_inv per tensor or block
  if (method == "modelopt") {                // NVIDIA ModelOpt exports
    std::string algo = q.get_string("quant_algo", "");
    for (char& ch : algo) ch = char(std::toupper(static_cast<unsigned char>(ch)));
    if (algo == "FP8") return {"fp8", 128};
    RV_CHECK(algo == "NVFP4" && q.get_int("group_size", 16) == 16, src, ": quantization_config modelopt quant_algo '", algo,
             "' (group_size ", q.get_int("group_size", 16), ") is not supported (FP8, NVFP4 in groups of 16)");
    return {"nvfp4", 16};
  }
  if (method == "compressed-tensors") {      // FP8 weights only: 8-bit float in every config group
    const Json& groups = q["config_groups"];
    RV_CHECK(groups.is_object() && !groups.as_object().empty(), src, ": quantization_config compressed-tensors without config_groups");
    for (const auto& [name, g] : groups.as_object()) {
      const Json& w = g["weights"];
      RV_CHECK(w.is_object() && w.get_int("num_bits", 0) == 8 && w.get_string("type", "") == "float", src,
               ": quantization_config compressed-tensors group '", name, "' has weights of ", w.get_int("num_bits", 0),
               "-bit type '", w.get_string("type", ""), "', which is not supported (8-bit float: FP8 E4M3)");
    }
    return {"fp8", 128};
  }
  RV_CHECK(method == "awq", src, ": quantization_config quant_method '", method,
           "' is not supported (supported: awq, 4-bit with zero points in the AutoAWQ GEMM layout; fp8 and ",
           "compressed-tensors FP8, E4M3 weights with scales; modelopt FP8 and NVFP4)");
  std::string version = q.get_string("version", "gemm");
  for (char& ch : version) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  const int64_t bits = q.get_int("bits", q.get_int("w_bit", 4)), group = q.get_int("group_size", q.get_int("q_group_size", 128));
  RV_CHECK(bits == 4 && q.get_bool("zero_point", true) && version == "gemm", src, ": quantization_config awq with bits ",
           bits, ", zero_point ", q.get_bool("zero_point", true) ? "true" : "false", ", version '", version,
           "' is not supported (4-bit, zero_point true, version gemm)");
  RV_CHECK(group == 32 || group == 128, src, ": quantization_config group_size ", group, " is not supported (32 or 128)");
  return {"awq", int32_t(group)};
}

static VisionConfig parse_vision(const Json& top, const std::string& src) {
  const Json& j = top["vision_config"];
  VisionConfig v;
  v.depth = require_int(j, "depth", src);
  v.hidden_size = require_int(j, "hidden_size", src);
  v.intermediate_size = require_int(j, "intermediate_size", src);
  v.num_heads = require_int(j, "num_heads", src);
  v.in_channels = int32_t(j.get_int("in_channels", 3));
  v.patch_size = int32_t(j.get_int("patch_size", 16));
  v.temporal_patch_size = int32_t(j.get_int("temporal_patch_size", 2));
  v.spatial_merge_size = int32_t(j.get_int("spatial_merge_size", 2));
  v.out_hidden_size = require_int(j, "out_hidden_size", src);
  v.num_position_embeddings = require_int(j, "num_position_embeddings", src);
  v.hidden_act = j.get_string("hidden_act", "gelu_pytorch_tanh");
  const Json& rp = j["rope_parameters"];
  v.rope_theta = rp.is_object() ? rp.get_number("rope_theta", 10000.0) : j.get_number("rope_theta", 10000.0);
  if (j["deepstack_visual_indexes"].is_array()) v.deepstack_layers = int_or_list(j["deepstack_visual_indexes"]);
  v.image_token_id = int32_t(top.get_int("image_token_id", -1));
  v.video_token_id = int32_t(top.get_int("video_token_id", -1));
  v.vision_start_token_id = int32_t(top.get_int("vision_start_token_id", -1));
  v.vision_end_token_id = int32_t(top.get_int("vision_end_token_id", -1));
  RV_CHECK(v.hidden_act == "gelu_pytorch_tanh" || v.hidden_act == "gelu", src, ": vision_config hidden_act '",
           v.hidden_act, "' is not supported (gelu_pytorch_tanh, gelu)");
  RV_CHECK(v.hidden_size % v.num_heads == 0 && (v.hidden_size / v.num_heads) % 4 == 0, src,
           ": vision_config hidden_size / num_heads must be a multiple of 4");
  const int64_t side = int64_t(std::llround(std::sqrt(double(v.num_position_embeddings))));
  RV_CHECK(side * side == v.num_position_embeddings, src, ": vision_config num_position_embeddings (",
           v.num_position_embeddings, ") is not a square grid");
  RV_CHECK(v.image_token_id >= 0 && v.video_token_id >= 0, src, ": a vision_config needs image_token_id and video_token_id");
  return v;
}

ModelConfig ModelConfig::from_json(const Json& j, const std::string& src) {
  ModelConfig c;
  const auto& archs = j["architectures"];
  RV_CHECK(archs.is_array() && !archs.as_array().empty(), src,
           ": config has no 'architectures' entry");
  c.architecture = archs.as_array()[0].as_string();
  if (j["text_config"].is_object()) {  // a multimodal checkpoint: the language model's fields
    ModelConfig text = from_json_fields(j["text_config"], src, c.architecture);
    text.tie_word_embeddings = j.get_bool("tie_word_embeddings", text.tie_word_embeddings);
    if (text.quantization.method.empty()) text.quantization = parse_quantization(j, src);
    if (j["vision_config"].is_object()) text.vision = parse_vision(j, src);
    return text;
  }
  return from_json_fields(j, src, c.architecture);
}

ModelConfig ModelConfig::from_json_fields(const Json& j, const std::string& src, const std::string& arch) {
  ModelConfig c;
  c.architecture = arch;
  c.vocab_size = require_int(j, "vocab_size", src);
  c.hidden_size = require_int(j, "hidden_size", src);
  c.intermediate_size = j.get_int("num_experts", j.get_int("num_local_experts", 0)) > 0
                            ? int32_t(j.get_int("intermediate_size", 0))
                                                        : require_int(j, "intermediate_size", src);
  c.num_layers = require_int(j, "num_hidden_layers", src);
  c.num_heads = require_int(j, "num_attention_heads", src);
  c.num_kv_heads = int32_t(j.get_int("num_key_value_heads", c.num_heads));
  c.head_dim = int32_t(j.get_int("head_dim", 0));
  if (c.head_dim == 0) c.head_dim = c.hidden_size / c.num_heads;
  c.rms_norm_eps = float(j.get_number("rms_norm_eps", 1e-6));
  c.max_position_embeddings = int32_t(j.get_int("max_position_embeddings", 2048));
  c.tie_word_embeddings = j.get_bool("tie_word_embeddings", false);
  c.attention_bias = j.get_bool("attention_bias", false);
  c.mlp_bias = j.get_bool("mlp_bias", false);
  c.hidden_act = j.get_string("hidden_act", "silu");
  c.torch_dtype = j.get_string("dtype", j.get_string("torch_dtype", "float32"));
  c.eos_token_ids = int_or_list(j["eos_token_id"]);
  c.bos_token_id = int32_t(j.get_int("bos_token_id", -1));
  c.rope = parse_rope(j, c.max_position_embeddings);
  c.max_positions = c.max_position_embeddings;
  parse_hybrid(j, c);
  parse_flash_next(j, c, src);
  c.quantization = parse_quantization(j, src);
  RV_CHECK(!j.get_bool("use_sliding_window", false), src,
           ": sliding-window attention (use_sliding_window) is not supported");
  RV_CHECK(c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0, src,
           ": num_attention_heads (", c.num_heads, ") must be a multiple of num_key_value_heads (",
           c.num_kv_heads, ")");
  RV_CHECK(c.hidden_act == "silu", src, ": hidden_act '", c.hidden_act, "' is not supported (silu)");
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream f(path);
  RV_CHECK(f.good(), "cannot read ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  Json j;
  try {
    j = Json::parse(ss.str());
  } catch (const std::exception& e) {
    throw std::runtime_error(str_cat(path, ": ", e.what()));
  }
  return from_json(j, path);
}

std::vector<int32_t> mrope_axes(const RopeConfig& r, int32_t rotary_dim) {
  if (r.mrope_section.empty()) return {};
  const int32_t half = rotary_dim / 2;
  std::vector<int32_t> axes(static_cast<size_t>(half), 0);
  const auto& sec = r.mrope_section;
  RV_CHECK(sec.size() == 3, "rope_parameters.mrope_section must have 3 entries (time, height, width)");
  if (r.mrope_interleaved) {  // t h w t h w ..., each axis for its section's count of slots
    for (int32_t axis = 1; axis <= 2; ++axis)
      for (int32_t i = axis; i < std::min(half, 3 * sec[size_t(axis)]); i += 3) axes[size_t(i)] = axis;
  } else {
    RV_CHECK(sec[0] + sec[1] + sec[2] == half, "rope_parameters.mrope_section must sum to rotary_dim / 2 (", half, ")");
    for (int32_t i = 0; i < half; ++i) axes[size_t(i)] = i < sec[0] ? 0 : i < sec[0] + sec[1] ? 1 : 2;
  }
  return axes;
}

ops::RopeTables build_rope_tables(const RopeConfig& r, int32_t head_dim, int32_t max_positions) {
  const int32_t dim = int32_t(head_dim * r.partial_rotary_factor);
  const int32_t half = dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  // HF computes the base frequencies in float32: base ** (i / dim).
  for (int32_t i = 0; i < half; ++i)
    inv_freq[size_t(i)] = 1.0f / std::pow(float(r.theta), float(2 * i) / float(dim));
  double attention_scaling = 1.0;
  if (r.type == "linear") {
    for (auto& f : inv_freq) f = float(f / r.factor);
  } else if (r.type == "llama3") {
    const double old_len = double(r.original_max_position_embeddings);
    const double low_wl = old_len / r.low_freq_factor, high_wl = old_len / r.high_freq_factor;
    for (auto& f : inv_freq) {
      const float wavelen = float(2 * M_PI) / f;
      if (wavelen > low_wl) {
        f = float(f / r.factor);
      } else if (!(wavelen < high_wl)) {
        float smooth = float((old_len / wavelen - r.low_freq_factor) /
                             (r.high_freq_factor - r.low_freq_factor));
        f = (1 - smooth) * f / float(r.factor) + smooth * f;
      }
    }
  } else if (r.type == "yarn") {
    auto get_mscale = [](double scale, double m) {
      return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
    };
    if (r.attention_factor) attention_scaling = *r.attention_factor;
    else if (r.mscale && r.mscale_all_dim && *r.mscale != 0 && *r.mscale_all_dim != 0)
      attention_scaling = get_mscale(r.factor, *r.mscale) / get_mscale(r.factor, *r.mscale_all_dim);
    else
      attention_scaling = get_mscale(r.factor, 1.0);
    const double omax = double(r.original_max_position_embeddings);
    auto corr_dim = [&](double rot) {
      return (dim * std::log(omax / (rot * 2 * M_PI))) / (2 * std::log(r.theta));
    };
    double low = corr_dim(r.beta_fast), high = corr_dim(r.beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;
    for (int32_t i = 0; i < half; ++i) {
      float pos_freq = std::pow(float(r.theta), float(2 * i) / float(dim));
      float extra = 1.0f / pos_freq, inter = 1.0f / (float(r.factor) * pos_freq);
      float ramp = std::clamp((float(i) - float(low)) / float(high - low), 0.0f, 1.0f);
      float extra_factor = 1.0f - ramp;
      inv_freq[size_t(i)] = inter * (1 - extra_factor) + extra * extra_factor;
    }
  }
  ops::RopeTables t;
  t.rotary_dim = dim;
  t.cos = Tensor::empty({max_positions, half}, DType::kF32);
  t.sin = Tensor::empty({max_positions, half}, DType::kF32);
  float* c = t.cos.ptr<float>();
  float* s = t.sin.ptr<float>();
  for (int64_t p = 0; p < max_positions; ++p)
    for (int32_t i = 0; i < half; ++i) {
      float angle = float(p) * inv_freq[size_t(i)];
      c[p * half + i] = float(std::cos(angle) * attention_scaling);
      s[p * half + i] = float(std::sin(angle) * attention_scaling);
    }
  return t;
}

}  // namespace revolta
