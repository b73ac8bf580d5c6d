"""The engine's option table (cpp/include/revolta/engine_options.def) is the one source of the
engine options: the schema, LLM(...), the server's flags and docs/options.md follow it, and its
choices and bounds are checked by the engine alone."""

from pathlib import Path

import pytest

from revolta import _core
from revolta.config import ENGINE_TABLE, EngineOptions, options_reference
from revolta.server.cli import build_parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "options.md"


def test_every_row_is_an_option_a_flag_and_a_binding():
    assert len(ENGINE_TABLE) >= 20
    flags = {a.dest: a for a in build_parser()._actions}
    cfg = _core.EngineConfig()
    for row in ENGINE_TABLE:
        name = row["name"]
        field = EngineOptions.model_fields[name]
        assert field.description == row["help"] and hasattr(cfg, name)
        assert field.default == pytest.approx(getattr(cfg, name)), name  # the C++ default, as schema and flag show it
        action = flags[name]
        assert action.option_strings[0] == "--" + name.replace("_", "-")
        assert (action.choices or []) == row["choices"].split(), name
        assert row["help"].replace("%", "%%") in action.help


def test_choices_and_bounds_are_the_engines_checks():
    with pytest.raises(ValueError, match="async_scheduling must be auto, on or off; got 'always'"):
        EngineOptions(async_scheduling="always")
    with pytest.raises(ValueError, match=r"max_num_seqs must be in \[1, 4096\], got 0"):
        EngineOptions(max_num_seqs=0)
    with pytest.raises(ValueError, match="block_activation_bits must be 8 or 16; got '12'"):
        EngineOptions(block_activation_bits=12)
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        EngineOptions(seed=-1)
    cfg = _core.EngineConfig()
    cfg.kv_offloading_eviction = "mru"  # the same check, from C++ callers
    with pytest.raises(ValueError, match="kv_offloading_eviction must be lru or arc; got 'mru'"):
        cfg.validate_options()
    # Flags and environment variables give text: the schema takes it for numbers and choices alike.
    e = EngineOptions(block_activation_bits="8", gpu_memory_utilization="0.5", enforce_eager="true")
    assert e.block_activation_bits == 8 and e.gpu_memory_utilization == 0.5 and e.enforce_eager is True


def test_llm_takes_every_option_and_refuses_unknown_ones(tiny_llama_dir):
    import revolta

    with pytest.raises(ValueError, match="max_num_seq"):
        revolta.LLM(tiny_llama_dir, max_num_seq=4)  # (a typo of max_num_seqs)
    llm = revolta.LLM(tiny_llama_dir, max_num_seqs=3, num_threads=1, block_size=8, scheduling_policy="fcfs")
    assert llm.scheduling_policy == "fcfs"


def test_the_options_reference_is_generated_from_the_schema():
    text = options_reference()
    for row in ENGINE_TABLE:
        assert f"`--{row['name'].replace('_', '-')}`" in text
    assert "`--speculative-config`" in text and "`--tool-call-parser`" in text
    assert DOC.read_text() == text, "docs/options.md is stale: revolta options > docs/options.md"


def test_cuda_graph_sizes_take_none_a_list_and_text():
    """None (a caller passing the default on), a list, JSON or comma-separated text."""
    assert EngineOptions(cuda_graph_sizes=None).cuda_graph_sizes == []
    assert EngineOptions(cuda_graph_sizes=[1, 4]).cuda_graph_sizes == [1, 4]
    assert EngineOptions(cuda_graph_sizes="[2, 8]").cuda_graph_sizes == [2, 8]
    assert EngineOptions(cuda_graph_sizes="1, 16").cuda_graph_sizes == [1, 16]
    with pytest.raises(ValueError):
        EngineOptions(cuda_graph_sizes="eight")
