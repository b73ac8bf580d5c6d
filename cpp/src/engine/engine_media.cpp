// Multimodal prompts in a step: the encoder outputs of the media spans the scheduled chunks reach,
// taken from the encoder cache or made in one pass of the vision tower before the forward.
#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "engine/engine_impl.h"

namespace revolta {

void Engine::Impl::encode_media(const SchedulerOutput& plan) {
  if (!vision) return;
  struct Wanted {
    Request* r;
    size_t span;
  };
  std::vector<Wanted> missing;
  std::vector<VisionItem> items;
  std::unordered_map<std::string, size_t> item_of;  // a hash encoded once per step
  for (const ScheduledRequest& s : plan.scheduled) {
    Request& r = *s.request;
    if (!r.media) continue;
    const int32_t begin = r.num_computed_tokens, end = begin + s.num_new_tokens;
    for (size_t i = 0; i < r.media->spans.size(); ++i) {
      const MediaSpan& span = r.media->spans[i];
      if (span.end() <= begin) {
        r.encoded[i].reset();  // read by earlier chunks
        continue;
      }
      if (span.input.offset >= end || r.encoded[i]) continue;
      if ((r.encoded[i] = encoder_cache->get(span.input.hash))) continue;
      missing.push_back({&r, i});
      if (item_of.emplace(span.input.hash, items.size()).second)
        items.push_back({span.input.pixels.data(), span.input.grid_t, span.input.grid_h, span.input.grid_w});
    }
  }
  if (items.empty()) return;
  const char* was = phase.load();
  enter("vision encoder", int32_t(items.size()));
  const Tensor out = vision->encode(items);
  enter(was, phase_requests.load());
  std::vector<std::shared_ptr<const Tensor>> outputs(items.size());
  const int64_t H = out.size(1);
  int64_t row = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const int64_t n = items[k].patches() / model_cfg.vision.merge_unit();
    auto t = std::make_shared<Tensor>(Tensor::empty({n, H}, DType::kF32));
    std::copy_n(out.ptr<float>() + row * H, n * H, t->ptr<float>());
    outputs[k] = std::move(t);
    row += n;
  }
  for (const Wanted& w : missing) {
    const MediaSpan& span = w.r->media->spans[w.span];
    const auto& t = outputs[item_of.at(span.input.hash)];
    w.r->encoded[w.span] = t;
    encoder_cache->put(span.input.hash, t);
  }
  live.mm_items_encoded += int64_t(items.size());
}

}  // namespace revolta
