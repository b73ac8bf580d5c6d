// A multimodal prompt as the engine keeps it: its media spans, the multimodal rotary positions of
// every prompt token, and the keys its media give the prefix cache.
//
// Positions (Qwen2-VL onwards, HF get_rope_index): text tokens count up on all three axes; a media
// span of (t, h, w) merged cells starting where the text stands at p puts cell (i, j, k) at (p + i,
// p + j, p + k), and the text after it goes on from p + max(t, h, w). Tokens past the prompt sit at
// their index + delta on every axis (delta = the prompt's largest position + 1 - its length).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "revolta/engine.h"

namespace revolta {

struct MediaSpan {
  MediaInput input;
  int32_t tokens = 0;  // placeholder positions [input.offset, input.offset + tokens)
  uint64_t key = 0;    // 64-bit digest of input.hash
  int32_t end() const { return input.offset + tokens; }
};

struct MediaPrompt {
  std::vector<MediaSpan> spans;    // by offset, disjoint
  std::vector<int32_t> positions;  // [prompt length, 3]
  int32_t delta = 0;
  int32_t prompt_length() const { return int32_t(positions.size() / 3); }
  int32_t position(int32_t i, int axis) const {
    return i < prompt_length() ? positions[size_t(i) * 3 + size_t(axis)] : i + delta;
  }
  // Whether tokens [begin, end) include a media position (axes that differ).
  bool spatial(int32_t begin, int32_t end) const;
  // Token i's value in prefix-cache keys: the token, or within a media span a value drawn from the
  // media's key and the position in the span (so different media never share a block).
  int32_t cache_token(const std::vector<int32_t>& tokens, int32_t i) const;
};

// Checks the media against the prompt and the vision tower (shapes, placeholders, overlap) and lays
// out positions; throws std::invalid_argument naming the media item at fault.
std::shared_ptr<const MediaPrompt> make_media_prompt(std::vector<MediaInput> media, const std::vector<int32_t>& prompt,
                                                     const VisionConfig& vision);

}  // namespace revolta
