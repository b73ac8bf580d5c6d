#include "sample/grammar.h"

#include <dlfcn.h>

#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace revolta {

// The parts of llguidance's C API (its llguidance.h) the engine uses. LlgConstraintInit is only
// ever filled by llg_constraint_init_set_defaults in a buffer larger than the struct, so a later
// library with more fields cannot write past it; the engine sets only its first field.
namespace {
struct TokenizerInitV2 {
  size_t struct_size;
  uint32_t vocab_size;
  uint32_t tok_eos;
  const uint32_t* token_lens;
  const uint8_t* token_bytes;
  const char* tokenizer_json;
  bool tokenize_assumes_string;
  void* tokenize_fn;
  bool use_approximate_greedy_tokenize_fn;
  const void* tokenize_user_data;
  const char* const* slices;
  const uint32_t* tok_eos_extra;
  uint32_t tok_eos_extra_count;
};
struct alignas(16) ConstraintInitBuffer {
  unsigned char bytes[1024];
};
}  // namespace

struct GrammarApi {
  void* (*new_tokenizer_v2)(const TokenizerInitV2*, char*, size_t);
  void (*free_tokenizer)(void*);
  void (*constraint_init_set_defaults)(void*, const void*);
  void* (*new_matcher)(const void*, const char*, const char*);
  void (*free_matcher)(void*);
  const char* (*matcher_get_error)(void*);
  bool (*matcher_is_error)(const void*);
  size_t (*matcher_get_mask_byte_size)(const void*);
  int32_t (*matcher_compute_mask_into)(void*, uint32_t*, size_t);
  int32_t (*matcher_consume_token)(void*, uint32_t);
  bool (*matcher_is_stopped)(const void*);
};

namespace {

const GrammarApi* load_api(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, GrammarApi> loaded;
  std::lock_guard<std::mutex> lk(mu);
  if (auto it = loaded.find(path); it != loaded.end()) return &it->second;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h)
    throw std::invalid_argument("guided_decoding_library: cannot load " + path + " (" + dlerror() +
                                "); install llguidance (pip install llguidance)");
  GrammarApi api{};
  auto get = [&](auto& fn, const char* name) {
    void* p = dlsym(h, name);
    if (!p) throw std::invalid_argument("guided_decoding_library: " + path + " has no " + name + " (llguidance too old?)");
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  get(api.new_tokenizer_v2, "llg_new_tokenizer_v2");
  get(api.free_tokenizer, "llg_free_tokenizer");
  get(api.constraint_init_set_defaults, "llg_constraint_init_set_defaults");
  get(api.new_matcher, "llg_new_matcher");
  get(api.free_matcher, "llg_free_matcher");
  get(api.matcher_get_error, "llg_matcher_get_error");
  get(api.matcher_is_error, "llg_matcher_is_error");
  get(api.matcher_get_mask_byte_size, "llg_matcher_get_mask_byte_size");
  get(api.matcher_compute_mask_into, "llg_matcher_compute_mask_into");
  get(api.matcher_consume_token, "llg_matcher_consume_token");
  get(api.matcher_is_stopped, "llg_matcher_is_stopped");
  return &loaded.emplace(path, api).first->second;
}

}  // namespace

GrammarTokenizer::GrammarTokenizer(const std::string& library, const std::string& tokenizer_json_path, int32_t eos) {
  api_ = load_api(library);
  std::ifstream in(tokenizer_json_path);
  if (!in) throw std::invalid_argument("guided decoding needs the model's tokenizer.json; cannot read " + tokenizer_json_path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();
  TokenizerInitV2 init{};
  init.struct_size = sizeof init;
  init.tok_eos = uint32_t(eos);
  init.tokenizer_json = json.c_str();
  init.use_approximate_greedy_tokenize_fn = true;  // (tokenizing forced text; masks do not use it)
  char err[1024] = {};
  tok_ = api_->new_tokenizer_v2(&init, err, sizeof err);
  if (!tok_) throw std::invalid_argument(std::string("guided decoding: llguidance refused the tokenizer: ") + err);
}

GrammarTokenizer::~GrammarTokenizer() {
  if (tok_) api_->free_tokenizer(tok_);
}

GrammarMatcher::GrammarMatcher(const GrammarTokenizer& tok, const std::string& kind, const std::string& data)
    : api_(tok.api()) {
  ConstraintInitBuffer init{};
  api_.constraint_init_set_defaults(&init, tok.handle());
  // No stderr logging: errors come back through matcher_get_error.
  std::memset(init.bytes + sizeof(void*), 0, 2 * sizeof(uint32_t));
  m_ = api_.new_matcher(&init, kind.c_str(), data.c_str());
  if (api_.matcher_is_error(m_)) {
    const std::string e = error();
    api_.free_matcher(m_);
    m_ = nullptr;
    throw std::invalid_argument("guided_decoding (" + kind + "): " + e);
  }
  mask_.resize(api_.matcher_get_mask_byte_size(m_) / 4);
}

GrammarMatcher::~GrammarMatcher() {
  if (m_) api_.free_matcher(m_);
}

std::string GrammarMatcher::error() const {
  const char* e = api_.matcher_get_error(m_);
  return e ? e : "";
}

const std::vector<uint32_t>& GrammarMatcher::allowed() {
  if (mask_current_ || !constrains()) return mask_;
  if (api_.matcher_compute_mask_into(m_, mask_.data(), mask_.size() * 4) != 0) std::fill(mask_.begin(), mask_.end(), 0u);
  if (phase_ == Phase::kMayReason && size_t(start_) / 32 < mask_.size()) mask_[size_t(start_) / 32] |= 1u << (start_ % 32);
  mask_current_ = true;
  return mask_;
}

bool GrammarMatcher::consume(int32_t token) {
  mask_current_ = false;
  if (phase_ == Phase::kReasoning) {
    if (token == end_) phase_ = Phase::kAnswer;
    if (token != answer_) return true;
  } else if (phase_ == Phase::kMayReason) {
    if (token == start_) {
      phase_ = Phase::kReasoning;
      return true;
    }
  }
  phase_ = Phase::kAnswer;
  return api_.matcher_consume_token(m_, uint32_t(token)) == 0;
}

void GrammarMatcher::reason_first(int32_t start, int32_t end, int32_t answer, bool in_reasoning) {
  if (end < 0) return;
  start_ = start, end_ = end, answer_ = answer;
  phase_ = in_reasoning ? Phase::kReasoning : start >= 0 ? Phase::kMayReason : Phase::kAnswer;
  mask_current_ = false;
}

void MaskJobs::start(std::vector<GrammarMatcher*> matchers) {
  wait();
  if (matchers.empty()) return;
  thread_ = std::thread([m = std::move(matchers)] {
    for (GrammarMatcher* g : m) g->allowed();
  });
}

void MaskJobs::wait() {
  if (thread_.joinable()) thread_.join();
}

bool GrammarMatcher::stopped() const { return api_.matcher_is_stopped(m_); }

}  // namespace revolta
