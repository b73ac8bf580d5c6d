"""KV offload tiers (kv_offloading_size, kv_offloading_disk): blocks evicted from the device pool come
back from host memory, a restarted engine finds them on disk, and a damaged, foreign or unwritable
disk tier costs only the hit. Every answer is checked against an engine without offload."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import make_hf_model
from revolta import LLM, SamplingParams

SP = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
LEN = 256


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    make_hf_model("llama", d, seed=3, max_position_embeddings=512)
    probe = LLM(str(d), max_model_len=LEN)
    bytes_per_token = probe.model_info.kv_cache_bytes // probe.model_info.kv_cache_tokens
    probe.engine.shutdown()
    return str(d), bytes_per_token


def prompt(seed: int, n: int = 200) -> list[int]:
    return np.random.default_rng(seed).integers(3, 250, size=n).tolist()


@pytest.fixture(scope="module")
def reference(model):
    llm = LLM(model[0], max_model_len=LEN, enable_prefix_caching=False)
    out = {s: llm.generate([{"prompt_token_ids": prompt(s)}], SP)[0].outputs[0].token_ids for s in (1, 2, 3)}
    llm.engine.shutdown()
    return out


def engine(model, **kw) -> LLM:
    # A pool of 320 tokens: a second 200-token prompt evicts the first one's blocks.
    return LLM(model[0], max_model_len=LEN, kv_cache_memory_bytes=model[1] * 320, **kw)


def ask(llm: LLM, seed: int):
    return llm.generate([{"prompt_token_ids": prompt(seed)}], SP)[0]


@pytest.mark.parametrize("eviction", ["lru", "arc"])
def test_evicted_prefix_comes_back_from_host_memory(model, reference, eviction):
    llm = engine(model, kv_offloading_size=0.01, kv_offloading_eviction=eviction)
    first = ask(llm, 1)
    ask(llm, 2)  # evicts prompt 1's blocks from the device pool
    again = ask(llm, 1)
    s = llm.engine.stats()
    llm.engine.shutdown()
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == reference[1]
    assert again.num_cached_tokens == 192  # 12 full blocks, device and host together
    assert s.kv_offload_hit_tokens >= 64 and s.kv_offload_host_hits * 16 == s.kv_offload_hit_tokens
    assert s.kv_offload_bytes_restored > 0 and s.kv_offload_bytes_offloaded >= s.kv_offload_bytes_restored
    # Without the tier, the same sequence recomputes what was evicted.
    plain = engine(model)
    ask(plain, 1), ask(plain, 2)
    assert ask(plain, 1).num_cached_tokens < 192
    plain.engine.shutdown()


def test_disk_tier_survives_a_restart(model, reference, tmp_path):
    disk = {"root_dir": str(tmp_path / "kv"), "max_size_bytes": 1 << 30, "min_free_bytes": 0}
    llm = engine(model, kv_offloading_size=0.01, kv_offloading_disk=disk)
    ask(llm, 1)
    llm.engine.shutdown()  # what was computed is on disk now
    (fp_dir,) = [p for p in (tmp_path / "kv").iterdir()]
    seed = (fp_dir / "hash_seed").read_text()
    assert len(list(fp_dir.glob("*.kvb"))) == 12

    again = engine(model, kv_offloading_size=0.01, kv_offloading_disk=disk)
    out = ask(again, 1)
    s = again.engine.stats()
    again.engine.shutdown()
    assert out.outputs[0].token_ids == reference[1] and out.num_cached_tokens == 192
    assert s.kv_offload_disk_hits == 12 and s.kv_offload_disk_bytes_read > 0 and s.kv_offload_disk_rejected == 0
    assert (fp_dir / "hash_seed").read_text() == seed

    other = engine(model, kv_offloading_size=0.01, kv_offloading_disk=disk, kv_cache_dtype="int8")  # another format
    out = ask(other, 1)
    s = other.engine.stats()
    other.engine.shutdown()
    assert s.kv_offload_disk_hits == 0 and out.num_cached_tokens == 0  # its own directory: nothing to find
    assert len([p for p in (tmp_path / "kv").iterdir()]) == 2


def damage(path, how: str, foreign: list):
    data = path.read_bytes()
    if how == "flipped":
        path.write_bytes(data[:-40] + bytes([data[-40] ^ 0xFF]) + data[-39:])
    elif how == "truncated":
        path.write_bytes(data[: len(data) - 100])
    else:  # another model's block under this name
        path.write_bytes(foreign.pop())


@pytest.mark.parametrize("how", ["flipped", "truncated", "foreign"])
def test_damaged_blocks_are_misses(model, reference, tmp_path, how):
    disk = {"root_dir": str(tmp_path / "kv"), "max_size_bytes": 1 << 30, "min_free_bytes": 0}
    foreign = []
    if how == "foreign":
        d = tmp_path / "other"
        make_hf_model("llama", d, seed=4, max_position_embeddings=512)
        o = LLM(str(d), max_model_len=LEN, kv_cache_memory_bytes=model[1] * 320, kv_offloading_size=0.01,
                kv_offloading_disk={"root_dir": str(tmp_path / "okv")})
        o.generate([{"prompt_token_ids": prompt(1)}], SP)
        o.engine.shutdown()
        foreign = [p.read_bytes() for p in next((tmp_path / "okv").iterdir()).glob("*.kvb")]
    llm = engine(model, kv_offloading_disk=disk)
    ask(llm, 1)
    llm.engine.shutdown()
    (fp_dir,) = list((tmp_path / "kv").iterdir())
    for p in fp_dir.glob("*.kvb"):
        damage(p, how, foreign)

    again = engine(model, kv_offloading_disk=disk)
    out = ask(again, 1)
    s = again.engine.stats()
    later = ask(again, 2)  # and it goes on serving
    again.engine.shutdown()
    assert out.outputs[0].token_ids == reference[1] and later.outputs[0].token_ids == reference[2]
    assert s.kv_offload_disk_hits == 0 and s.kv_offload_disk_rejected >= 1 and out.num_cached_tokens == 0


def test_a_full_disk_skips_writes_and_serves(model, reference, tmp_path):
    disk = {"root_dir": str(tmp_path / "kv"), "min_free_bytes": 1 << 60}  # more than any disk has free
    llm = engine(model, kv_offloading_size=0.01, kv_offloading_disk=disk)
    outs = [ask(llm, s) for s in (1, 2, 3)]
    llm.engine.shutdown()
    s = llm.engine.stats()
    assert [o.outputs[0].token_ids for o in outs] == [reference[1], reference[2], reference[3]]
    assert s.kv_offload_disk_write_skips >= 12 and s.kv_offload_disk_bytes == 0
    assert not list(next((tmp_path / "kv").iterdir()).glob("*.kvb"))


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """A tiny Qwen3-Next and its greedy answer to prompt 1 without offload."""
    d = tmp_path_factory.mktemp("next")
    make_hf_model("qwen3_next", d, seed=5, max_position_embeddings=512)
    plain = LLM(str(d), max_model_len=LEN, enable_prefix_caching=False)
    ref = plain.generate([{"prompt_token_ids": prompt(1)}], SP)[0].outputs[0].token_ids
    plain.engine.shutdown()
    return str(d), ref


def test_hybrid_state_snapshots_go_with_their_blocks(hybrid):
    """Qwen3-Next: a prefix hit needs the DeltaNet state snapshot of its last block; with one snapshot
    slot the second prompt evicts the first's, which comes back from host memory with its blocks."""
    d, ref = hybrid
    p1 = {"prompt_token_ids": prompt(1)}
    llm = LLM(d, max_model_len=LEN, max_num_seqs=1, kv_offloading_size=0.05)
    llm.generate([p1], SP)
    llm.generate([{"prompt_token_ids": prompt(2)}], SP)  # its snapshot takes the only slot
    again = llm.generate([p1], SP)[0]
    s = llm.engine.stats()
    llm.engine.shutdown()
    assert again.outputs[0].token_ids == ref and again.num_cached_tokens == 192
    assert s.kv_offload_host_hits >= 1  # the state snapshot at least (its blocks may still be on the device)


def test_options_are_checked(model, tmp_path):
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        LLM(model[0], max_model_len=LEN, kv_offloading_size=1, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="kv_offloading_eviction"):
        LLM(model[0], max_model_len=LEN, kv_offloading_size=1, kv_offloading_eviction="fifo")
    with pytest.raises(ValueError, match="unknown key"):
        LLM(model[0], max_model_len=LEN, kv_offloading_disk={"root": str(tmp_path)})
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="root_dir"):
        LLM(model[0], max_model_len=LEN, kv_offloading_disk={"root_dir": str(blocker / "kv")})


def test_metrics_show_the_tiers(model, tmp_path):
    from revolta.server.metrics import Metrics

    llm = engine(model, kv_offloading_size=0.01, kv_offloading_disk={"root_dir": str(tmp_path / "kv")})
    for s in (1, 2, 1):
        ask(llm, s)
    text = Metrics(llm.engine).render().decode()
    llm.engine.shutdown()
    assert 'revolta:kv_offload_hits{tier="host"}' in text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and line[0] != "#"}
    assert values['revolta:kv_offload_hits{tier="host"}'] > 0
    assert values['revolta:kv_offload_bytes_moved{direction="restored"}'] > 0
    assert values["revolta:kv_offload_hit_tokens"] > 0
    assert os.path.isdir(tmp_path / "kv")


def test_tensor_parallel_ranks_offload_their_shards(hybrid, tmp_path):
    """TP 2 on a hybrid model: each rank writes and reads its share of every entry (KV heads, DeltaNet
    states); a restarted engine's answer from disk matches the TP 1 engine's without offload."""
    d, ref = hybrid
    p1 = {"prompt_token_ids": prompt(1)}
    opts = dict(max_model_len=LEN, tensor_parallel_size=2, max_num_seqs=1, kv_offloading_size=0.05,
                kv_offloading_disk={"root_dir": str(tmp_path / "kv")})
    first = LLM(d, **opts)
    assert first.generate([p1], SP)[0].outputs[0].token_ids == ref
    first.engine.shutdown()
    again = LLM(d, **opts)
    out = again.generate([p1], SP)[0]
    s = again.engine.stats()
    again.engine.shutdown()
    assert out.outputs[0].token_ids == ref and out.num_cached_tokens == 192
    assert s.kv_offload_disk_hits == 13  # 12 blocks and the state snapshot of the last one
