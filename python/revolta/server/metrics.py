"""Prometheus metrics of one server (its own registry, so several apps can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self, engine):
        self.engine = engine
        r = self.registry = CollectorRegistry()
        p = "revolta:"
        self.running = Gauge(p + "num_requests_running", "requests in the engine's running set", registry=r)
        self.waiting = Gauge(p + "num_requests_waiting", "requests waiting to be scheduled", registry=r)
        self.waiting_by_priority = Gauge(p + "num_requests_waiting_by_priority", "requests waiting, by their priority",
                                         ["priority"], registry=r)
        self.rejected = Counter(p + "requests_rejected", "requests refused before they reached the engine, by reason: "
                                "queue_full (429), request_too_large (400: n x prompts), body_too_large (413), "
                                "body_timeout (408), bodies_held (503), unauthorized (401)", ["reason"], registry=r)
        self.kv_usage = Gauge(p + "kv_cache_usage_perc", "fraction of KV blocks in use", registry=r)
        self.prefix_hit_rate = Gauge(p + "prefix_cache_hit_rate", "prefix-cache hits / queries (tokens)", registry=r)
        self.prefix_queries = Gauge(p + "prefix_cache_queries", "prompt tokens looked up in the prefix cache", registry=r)
        self.prefix_hits = Gauge(p + "prefix_cache_hits", "prompt tokens found in the prefix cache", registry=r)
        self.preemptions = Gauge(p + "num_preemptions", "requests preempted so far", registry=r)
        self.mm_encoded = Gauge(p + "mm_items_encoded", "images and video frame groups the vision tower encoded", registry=r)
        self.mm_cache_hits = Gauge(p + "mm_encoder_cache_hits", "media found in the encoder cache", registry=r)
        self.mm_cache_bytes = Gauge(p + "mm_encoder_cache_bytes", "bytes the encoder cache holds", registry=r)
        # KV offload tiers (host memory, disk).
        self.offload_hit_tokens = Gauge(p + "kv_offload_hit_tokens", "prompt tokens brought back from an offload tier",
                                        registry=r)
        self.offload_hits = Gauge(p + "kv_offload_hits", "entries found per offload tier", ["tier"], registry=r)
        self.offload_tier_bytes = Gauge(p + "kv_offload_tier_bytes", "bytes each offload tier holds", ["tier"], registry=r)
        self.offload_moved = Gauge(p + "kv_offload_bytes_moved", "bytes moved: offloaded (device to host), restored "
                                   "(host to device), disk_written, disk_read", ["direction"], registry=r)
        self.offload_rejected = Gauge(p + "kv_offload_disk_rejected", "disk blocks failing a check (checksum, header)",
                                      registry=r)
        self.offload_skips = Gauge(p + "kv_offload_disk_write_skips", "disk writes not made (min_free_bytes, errors)",
                                   registry=r)
        # Speculative decoding, with vLLM's names.
        self.spec_drafts = Gauge(p + "spec_decode_num_drafts", "steps that verified drafts", registry=r)
        self.spec_draft_tokens = Gauge(p + "spec_decode_num_draft_tokens", "draft tokens proposed", registry=r)
        self.spec_accepted = Gauge(p + "spec_decode_num_accepted_tokens", "draft tokens accepted", registry=r)
        self.spec_draft_seconds = Gauge(p + "spec_decode_draft_seconds", "time spent proposing drafts", registry=r)
        self.spec_verify_seconds = Gauge(p + "spec_decode_verify_seconds", "time of the steps that verified drafts",
                                         registry=r)
        self.spec_accepted_per_pos = Gauge(p + "spec_decode_num_accepted_tokens_per_pos", "draft tokens accepted by position",
                                           ["position"], registry=r)
        self.spec_acceptance = Gauge(p + "spec_decode_acceptance_rate", "draft tokens accepted / proposed", registry=r)
        r.register(_AcceptedLength(engine, p + "spec_decode_accepted_length"))
        self.prompt_tokens = Counter(p + "prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "generated tokens", registry=r)
        self.requests = Counter(p + "request_success", "finished requests", ["finished_reason"], registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "time to first token", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "time between tokens", buckets=_LATENCY_BUCKETS, registry=r)

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason=reason).inc()

    def render(self) -> bytes:
        s = self.engine.stats()
        self.running.set(s.num_running)
        self.waiting.set(s.num_waiting)
        self.waiting_by_priority.clear()
        self.waiting_by_priority.labels(priority="0").set(0)  # the default priority's queue, even when empty
        for priority, n in getattr(s, "waiting_by_priority", []):
            self.waiting_by_priority.labels(priority=str(priority)).set(n)
        self.kv_usage.set(s.num_blocks_used / s.num_blocks_total if s.num_blocks_total else 0.0)
        self.prefix_queries.set(s.prefix_cache_queries)
        self.prefix_hits.set(s.prefix_cache_hits)
        self.prefix_hit_rate.set(s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0)
        self.preemptions.set(s.num_preemptions)
        self.mm_encoded.set(getattr(s, "mm_items_encoded", 0))
        self.mm_cache_hits.set(getattr(s, "mm_encoder_cache_hits", 0))
        self.mm_cache_bytes.set(getattr(s, "mm_encoder_cache_bytes", 0))
        self.offload_hit_tokens.set(s.kv_offload_hit_tokens)
        self.offload_hits.labels(tier="host").set(s.kv_offload_host_hits)
        self.offload_hits.labels(tier="disk").set(s.kv_offload_disk_hits)
        self.offload_tier_bytes.labels(tier="host").set(s.kv_offload_host_bytes)
        self.offload_tier_bytes.labels(tier="disk").set(s.kv_offload_disk_bytes)
        for direction, n in (("offloaded", s.kv_offload_bytes_offloaded), ("restored", s.kv_offload_bytes_restored),
                             ("disk_written", s.kv_offload_disk_bytes_written), ("disk_read", s.kv_offload_disk_bytes_read)):
            self.offload_moved.labels(direction=direction).set(n)
        self.offload_rejected.set(s.kv_offload_disk_rejected)
        self.offload_skips.set(s.kv_offload_disk_write_skips)
        self.spec_drafts.set(s.spec_num_drafts)
        self.spec_draft_tokens.set(s.spec_num_draft_tokens)
        self.spec_accepted.set(s.spec_num_accepted_tokens)
        self.spec_draft_seconds.set(getattr(s, "spec_draft_time_us", 0) / 1e6)
        self.spec_verify_seconds.set(getattr(s, "spec_verify_time_us", 0) / 1e6)
        for pos, n in enumerate(s.spec_accepted_per_position):
            self.spec_accepted_per_pos.labels(position=str(pos)).set(n)
        self.spec_acceptance.set(s.spec_num_accepted_tokens / s.spec_num_draft_tokens if s.spec_num_draft_tokens else 0.0)
        return generate_latest(self.registry)


class _AcceptedLength:
    """Drafts accepted per verify step, as a histogram: a verify step accepts draft j only after
    draft j - 1, so the per-position counters give it exactly (steps with length >= j + 1 are
    those that accepted position j)."""

    def __init__(self, engine, name: str):
        self.engine, self.name = engine, name

    def describe(self):
        return [HistogramMetricFamily(self.name, "draft tokens accepted per verify step")]

    def collect(self):
        s = self.engine.stats()
        per_pos, n = list(s.spec_accepted_per_position), s.spec_num_drafts
        buckets = [(str(length), n - per_pos[length]) for length in range(len(per_pos))] + [("+Inf", n)]
        h = HistogramMetricFamily(self.name, "draft tokens accepted per verify step")
        h.add_metric([], buckets, sum_value=s.spec_num_accepted_tokens)
        yield h
