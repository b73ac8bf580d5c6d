"""The scheduling policies on the real demo model: with one running slot, the order requests finish
in is the order the policy admits them."""

from __future__ import annotations

import pytest

from revolta import LLM, SamplingParams, _core


def finish_order(llm: LLM, tags: list[_core.SchedulingTag]) -> list[int]:
    """Adds one short request per tag in one call (the engine sees them in the same step) and
    returns their indices in the order they finish."""
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True).to_core(2)
    prompt = llm.get_tokenizer().encode("The order of things")
    ids = llm.engine.add_requests([prompt] * len(tags), [params] * len(tags), tags)
    index = {rid: i for i, rid in enumerate(ids)}
    order: list[int] = []
    while len(order) < len(ids):
        order += [index[o.request_id] for o in llm.engine.await_outputs(0.05) if o.finished]
    return order


@pytest.mark.parametrize("policy", ["fcfs", "priority", "fair"])
def test_admission_order_by_policy(demo_model_dir, policy):
    with LLM(demo_model_dir, max_num_seqs=1, kv_cache_memory_bytes=64 << 20, max_model_len=512,
             scheduling_policy=policy) as llm:
        T = _core.SchedulingTag
        # A request of three sequences (group 1, priority 3), then two single ones.
        tags = [T(priority=3, group=1), T(priority=3, group=1), T(priority=3, group=1),
                T(priority=1, group=2), T(priority=2, group=3)]
        expected = {
            "fcfs": [0, 1, 2, 3, 4],      # arrival
            "priority": [3, 4, 0, 1, 2],  # lowest priority value first, then arrival
            "fair": [0, 3, 4, 1, 2],      # the groups by turns: every group's first before a second
        }[policy]
        assert finish_order(llm, tags) == expected
        assert llm.stats().num_preemptions == 0  # one slot, nothing displaced (ties are not enough)


def test_generate_priority_needs_the_priority_policy(demo_model_dir):
    with LLM(demo_model_dir, max_num_seqs=2, kv_cache_memory_bytes=64 << 20, max_model_len=512) as llm:
        with pytest.raises(ValueError, match="scheduling_policy='priority'"):
            llm.generate(["a", "b"], SamplingParams(max_tokens=1), priority=[0, 1])
        with pytest.raises(ValueError, match="2 priorities for 1 prompts"):
            llm.generate(["a"], SamplingParams(max_tokens=1), priority=[0, 1])
        out = llm.generate(["a", "b"], SamplingParams(max_tokens=1), priority=[0, 0])
        assert len(out) == 2 and all(len(o.outputs[0].token_ids) == 1 for o in out)


def test_unknown_policy_names_the_option(demo_model_dir):
    with pytest.raises(ValueError, match="scheduling_policy"):
        LLM(demo_model_dir, scheduling_policy="lifo")
