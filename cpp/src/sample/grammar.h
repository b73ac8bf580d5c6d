// Constrained decoding through llguidance's C API (guided_decoding: a JSON schema, any JSON object,
// a regular expression or a Lark grammar). The library is the one inside the `llguidance` PyPI
// wheel, which exports its C functions (llg_*): the engine loads it once (EngineConfig::
// guided_decoding_library) and computes each constrained row's token mask itself, so no Python
// runs per token. (xgrammar's wheel exports only its Python bindings.)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace revolta {

struct GrammarApi;  // the library's functions (grammar.cpp)

// One tokenizer for every matcher of an engine: the model's tokenizer.json and its EOS token.
class GrammarTokenizer {
 public:
  // Throws std::invalid_argument naming guided_decoding_library when the library or a symbol is missing.
  GrammarTokenizer(const std::string& library, const std::string& tokenizer_json_path, int32_t eos_token);
  ~GrammarTokenizer();
  GrammarTokenizer(const GrammarTokenizer&) = delete;
  GrammarTokenizer& operator=(const GrammarTokenizer&) = delete;
  const GrammarApi& api() const { return *api_; }
  void* handle() const { return tok_; }

 private:
  const GrammarApi* api_ = nullptr;
  void* tok_ = nullptr;
};

// A request's grammar state: which tokens may come next, advanced by each token it takes.
class GrammarMatcher {
 public:
  // kind: json | json_object | regex | lark. Throws std::invalid_argument with the library's
  // message when the grammar does not compile (an invalid or unsupported schema).
  GrammarMatcher(const GrammarTokenizer& tok, const std::string& kind, const std::string& data);
  ~GrammarMatcher();
  GrammarMatcher(const GrammarMatcher&) = delete;
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;
  // The tokens allowed next, one bit each (token t: bit t % 32 of word t / 32); tokens past the
  // tokenizer's vocabulary are never allowed. Nothing is allowed when the matcher is in error.
  // Computed once per state: the engine computes it on another thread while the step's forward
  // runs (MaskJobs), and the sampler then reads it.
  const std::vector<uint32_t>& allowed();
  // False (and error() says why) when the token breaks the grammar.
  bool consume(int32_t token);
  // Reasoning before the grammar (a thinking model's <think> ... </think>): while in it no token
  // is masked or fed to the grammar; `end` leaves it, `answer` too as the grammar's first token;
  // the answer's first token may be `start`, which opens it. Tokens < 0: none.
  void reason_first(int32_t start, int32_t end, int32_t answer, bool in_reasoning);
  bool constrains() const { return phase_ != Phase::kReasoning; }  // allowed() holds for the next token
  bool stopped() const;  // the grammar is complete: only EOS may follow
  std::string error() const;

 private:
  const GrammarApi& api_;
  void* m_ = nullptr;
  std::vector<uint32_t> mask_;
  bool mask_current_ = false;  // mask_ is the current state's (cleared by consume)
  enum class Phase { kAnswer, kReasoning, kMayReason } phase_ = Phase::kAnswer;
  int32_t start_ = -1, end_ = -1, answer_ = -1;
};

// The masks of a step's constrained rows, computed on a thread of their own while the engine
// thread runs the step's forward; wait() (or the destructor, so no matcher is freed under it)
// joins it.
class MaskJobs {
 public:
  void start(std::vector<GrammarMatcher*> matchers);
  void wait();
  ~MaskJobs() { wait(); }

 private:
  std::thread thread_;
};

}  // namespace revolta
