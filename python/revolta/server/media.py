"""Media in API requests. The three APIs turn their image parts into chat content parts
({"type": "image_url", "image_url": {"url": ...}}: Anthropic base64 sources become data URLs,
Responses' input_image its image_url); conversation() finds them in order, the template sees
{"type": "image"} in their place, and after templating they are loaded within the server's policy
(data URLs; http(s) of allowed hosts; files under the allowed path), checked against
limit_mm_per_prompt and expanded by the model's processor into the engine's MediaInputs. Every
failure is a 400 naming the content part."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from revolta.multimodal.media_io import MediaPolicy, load_image, read_url
from revolta.multimodal.prompt import MultimodalProcessor
from revolta.server.errors import APIError

# mm_processor_kwargs a request may set (with --trust-request-mm-kwargs): the image budget.
REQUEST_MM_KWARGS = frozenset({"min_pixels", "max_pixels"})


@dataclass
class MediaRef:
    kind: str  # image | video
    url: str
    where: str  # the content part, as the API names it: messages[1].content[0]


def part_url(part: dict[str, Any], key: str) -> str | None:
    """image_url / video_url as {"url": ...} or a bare string."""
    v = part.get(key)
    if isinstance(v, dict):
        v = v.get("url")
    return v if isinstance(v, str) and v else None


def no_media_allowed(limits: dict[str, int] | None) -> bool:
    """Whether --limit-mm-per-prompt allows no image and no video (a modality it leaves out is allowed)."""
    return bool(limits) and not any(limits.get(kind, 1) for kind in ("image", "video"))


class RequestMedia:
    def __init__(self, processor: MultimodalProcessor | None, policy: MediaPolicy, limits: dict[str, int] | None,
                 trust_kwargs: bool):
        self.processor = processor
        self.policy = policy
        self.limits = limits or {}
        self.trust_kwargs = trust_kwargs

    def template_part(self, part: dict[str, Any], where: str, refs: list[MediaRef]) -> dict[str, Any]:
        """A non-text content part as the chat template reads it; its media noted in refs."""
        kind = {"image_url": "image", "video_url": "video"}.get(part.get("type", ""))
        if kind is None:
            raise APIError(400, f"{where}: content parts of type '{part.get('type')}' are not supported", param=where)
        if self.processor is None:
            raise APIError(400, f"{where}: this model takes text only here (no vision tower loaded)", param=where)
        url = part_url(part, part["type"])
        if url is None:
            raise APIError(400, f"{where}: a {part['type']} part needs {part['type']}.url", param=where)
        refs.append(MediaRef(kind, url, where))
        limit = self.limits.get(kind)
        count = sum(r.kind == kind for r in refs)
        if limit is not None and count > limit:
            raise APIError(400, f"{where}: at most {limit} {kind}(s) may be sent in one prompt (the server's "
                                f"--limit-mm-per-prompt)", param=where)
        return {"type": kind}

    def processing_for(self, mm_kwargs: dict[str, Any] | None) -> MultimodalProcessor:
        """The processor, with a request's mm_processor_kwargs when the server trusts them."""
        if not mm_kwargs:
            return self.processor
        if not self.trust_kwargs:
            raise APIError(400, "mm_processor_kwargs are not accepted (the server was not started with "
                                "--trust-request-mm-kwargs)", param="mm_processor_kwargs")
        unknown = sorted(set(mm_kwargs) - REQUEST_MM_KWARGS)
        if unknown:
            raise APIError(400, f"mm_processor_kwargs: unknown {', '.join(unknown)} (known: "
                                f"{', '.join(sorted(REQUEST_MM_KWARGS))})", param="mm_processor_kwargs")
        if not all(isinstance(v, int) and v > 0 for v in mm_kwargs.values()):
            raise APIError(400, "mm_processor_kwargs: min_pixels and max_pixels are positive integers",
                           param="mm_processor_kwargs")
        processing = dataclasses.replace(self.processor.processing, **mm_kwargs)
        if processing.min_pixels > processing.max_pixels:
            raise APIError(400, "mm_processor_kwargs: min_pixels is above max_pixels", param="mm_processor_kwargs")
        return MultimodalProcessor(self.processor.tokens, processing, self.processor.encode_text,
                                   self.processor.video_processing)

    def expand(self, ids: list[int], refs: list[MediaRef], mm_kwargs: dict[str, Any] | None) -> tuple[list[int], list]:
        """(Runs in a worker thread.) The prompt's placeholders expanded and its media as the engine
        takes them."""
        processor = self.processing_for(mm_kwargs)
        images, videos = [], []
        for r in refs:
            try:
                if r.kind == "image":
                    images.append(processor.image(load_image(r.url, self.policy)))
                else:  # decoded and sampled here; its frame groups are cut when the prompt is expanded
                    videos.append(processor.sample_video(read_url(r.url, self.policy)))
            except ValueError as e:
                raise APIError(400, f"{r.where}: {e}", param=r.where) from None
        try:
            return processor.expand(ids, images, videos)
        except ValueError as e:
            raise APIError(400, f"the chat template did not place every image and video: {e}", param="messages") from None
