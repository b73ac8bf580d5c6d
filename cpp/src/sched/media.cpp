#include "sched/media.h"

#include <algorithm>

#include "core/error.h"

namespace revolta {

namespace {

uint64_t digest(const std::string& s) {  // FNV-1a, then a splitmix finish
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  return h;
}

}  // namespace

bool MediaPrompt::spatial(int32_t begin, int32_t end) const {
  for (const MediaSpan& s : spans)
    if (s.input.offset < end && s.end() > begin) return true;
  return false;
}

int32_t MediaPrompt::cache_token(const std::vector<int32_t>& tokens, int32_t i) const {
  for (const MediaSpan& s : spans)
    if (i >= s.input.offset && i < s.end()) {
      uint64_t h = s.key ^ (uint64_t(i - s.input.offset) * 0x9e3779b97f4a7c15ull);
      h ^= h >> 29;
      h *= 0x94d049bb133111ebull;
      h ^= h >> 32;
      return int32_t(uint32_t(h) | 0x80000000u);  // negative: never a real token id
    }
  return tokens[size_t(i)];
}

std::shared_ptr<const MediaPrompt> make_media_prompt(std::vector<MediaInput> media, const std::vector<int32_t>& prompt,
                                                     const VisionConfig& v) {
  RV_CHECK_ARG(v.depth > 0, "multimodal input: this model has no vision tower");
  auto mp = std::make_shared<MediaPrompt>();
  std::sort(media.begin(), media.end(), [](const MediaInput& a, const MediaInput& b) { return a.offset < b.offset; });
  const int32_t P = int32_t(prompt.size()), m = v.spatial_merge_size;
  for (size_t i = 0; i < media.size(); ++i) {
    MediaInput& in = media[i];
    const std::string what = "media item " + std::to_string(i) + " (" + in.kind + " at token " + std::to_string(in.offset) + ")";
    RV_CHECK_ARG(in.kind == "image" || in.kind == "video", what, ": kind must be image or video");
    RV_CHECK_ARG(!in.hash.empty(), what, ": no hash");
    RV_CHECK_ARG(in.grid_t >= 1 && in.grid_h > 0 && in.grid_w > 0 && in.grid_h % m == 0 && in.grid_w % m == 0, what,
                 ": grid ", in.grid_t, " x ", in.grid_h, " x ", in.grid_w, " (height and width multiples of ", m, ")");
    const int64_t patches = int64_t(in.grid_t) * in.grid_h * in.grid_w;
    RV_CHECK_ARG(int64_t(in.pixels.size()) == patches * v.patch_dim(), what, ": ", in.pixels.size(),
                 " pixel values for ", patches, " patches of ", v.patch_dim());
    MediaSpan s;
    s.tokens = int32_t(patches / v.merge_unit());
    s.key = digest(in.hash);
    const int32_t placeholder = in.kind == "image" ? v.image_token_id : v.video_token_id;
    RV_CHECK_ARG(in.offset >= 0 && int64_t(in.offset) + s.tokens <= P, what, ": its ", s.tokens,
                 " placeholder tokens run past the prompt's ", P);
    RV_CHECK_ARG(mp->spans.empty() || mp->spans.back().end() <= in.offset, what, " overlaps the item before it");
    for (int32_t k = in.offset; k < in.offset + s.tokens; ++k)
      RV_CHECK_ARG(prompt[size_t(k)] == placeholder, what, ": prompt token ", k, " is ", prompt[size_t(k)],
                   ", not the ", in.kind, " placeholder ", placeholder);
    s.input = std::move(in);
    mp->spans.push_back(std::move(s));
  }
  // Every placeholder token of the prompt belongs to an item.
  int32_t covered = 0;
  for (const MediaSpan& s : mp->spans) covered += s.tokens;
  const int32_t placeholders = int32_t(std::count_if(prompt.begin(), prompt.end(), [&](int32_t t) {
    return t == v.image_token_id || t == v.video_token_id;
  }));
  RV_CHECK_ARG(placeholders == covered, "multimodal input: the prompt has ", placeholders,
               " image / video placeholder tokens, its media cover ", covered);

  mp->positions.resize(size_t(P) * 3);
  int32_t at = 0, next = 0;  // next token index, next text position
  auto text_until = [&](int32_t end) {
    for (; at < end; ++at, ++next)
      for (int a = 0; a < 3; ++a) mp->positions[size_t(at) * 3 + size_t(a)] = next;
  };
  for (const MediaSpan& s : mp->spans) {
    text_until(s.input.offset);
    const int32_t t = s.input.grid_t, h = s.input.grid_h / m, w = s.input.grid_w / m;
    for (int32_t i = 0; i < t; ++i)
      for (int32_t j = 0; j < h; ++j)
        for (int32_t k = 0; k < w; ++k, ++at) {
          int32_t* p = &mp->positions[size_t(at) * 3];
          p[0] = next + i, p[1] = next + j, p[2] = next + k;
        }
    next += std::max({t, h, w});
  }
  text_until(P);
  mp->delta = next - P;
  return mp;
}

}  // namespace revolta
