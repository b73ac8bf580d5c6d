// Embedding the engine from C++: load a model directory, generate from token ids, print ids.
//
//   revolta_generate MODEL_DIR [--max-tokens N] [--temperature T] TOKEN_ID...
//
// Prints the generated token ids on one line, then the finish reason on the next.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "revolta/engine.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [--max-tokens N] [--temperature T] TOKEN_ID...\n", argv[0]);
    return 2;
  }
  revolta::EngineConfig config;
  config.model = argv[1];
  config.kv_cache_memory_bytes = int64_t(256) << 20;
  revolta::SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = 16;
  std::vector<int32_t> prompt;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--max-tokens") == 0 && i + 1 < argc) params.max_tokens = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--temperature") == 0 && i + 1 < argc) params.temperature = float(std::atof(argv[++i]));
    else prompt.push_back(int32_t(std::atoi(argv[i])));
  }
  try {
    revolta::Engine engine(config);
    uint64_t id = engine.add_request(prompt, params);
    std::string reason;
    for (bool done = false; !done;) {
      for (const auto& out : engine.await_outputs(std::chrono::milliseconds(1000))) {
        if (out.request_id != id) continue;
        for (const auto& t : out.tokens) std::printf("%d ", t.token);
        if (out.finished) {
          done = true;
          reason = revolta::to_string(out.finish_reason);
        }
      }
    }
    std::printf("\n%s\n", reason.c_str());
    engine.shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
