"""Bad arguments raise ValueError naming the field; budget refusals raise BieOutOfMemory."""

import pytest

import benni_inference as bi
from conftest import small_config

BAD_CONFIGS = [
    (dict(max_model_len=-1), "max_model_len must be >= 0"),
    (dict(max_model_len="long"), "max_model_len must be an int"),
    (dict(kv_group_size=48), "kv_group_size must be 32, 64 or 128"),
    (dict(kv_sink_tokens=-8), "kv_sink_tokens must be >= 0"),
    (dict(paged_block_size=-1), "paged_block_size must be >= 0"),
    (dict(chunked_prefill_size=0), "chunked_prefill_size must be >= 1"),
    (dict(max_num_seqs=0), "max_num_seqs must be >= 1"),
    (dict(gpu_memory_utilization=1.5), r"gpu_memory_utilization must be in \(0, 1\]"),
    (dict(gpu_memory_utilization=0), r"gpu_memory_utilization must be in \(0, 1\]"),
    (dict(kv_cache_memory=-5), "kv_cache_memory must be > 0 bytes"),
    (dict(threads=-1), "threads must be >= 0"),
    (dict(enable_prefix_caching="yes"), "enable_prefix_caching must be True or False"),
    (dict(kv_cache_dtype=""), "kv_cache_dtype must be a KV format name"),
    (dict(model=""), "model must be a GGUF path"),
    (dict(speculative_draft_tokens=16), "speculative_draft_tokens must be <= 15"),
    (dict(speculative_ngram_min=3, speculative_ngram_max=2), "speculative_ngram_max must be >= 3"),
    (dict(speculative_draft_tokens=-1), "speculative_draft_tokens must be >= 0"),
    (dict(device=""), "device must be 'auto', 'cpu', 'vulkan' or 'vulkan:N'"),
    (dict(device=0), "device must be 'auto', 'cpu', 'vulkan' or 'vulkan:N'"),
]


@pytest.mark.parametrize("kwargs,message", BAD_CONFIGS)
def test_bad_config_values_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bi.EngineConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(kv_cache_dtype="int3"), "int3"),
        (dict(kv_cache_memory="lots"), "kv_cache_memory: 'lots' is not a byte size"),
        (dict(model="/nonexistent/model.gguf"), "/nonexistent/model.gguf"),
        # The device, resolved as bie --device resolves it.
        (dict(device="tpu"), "unknown device 'tpu'"),
        (dict(device="vulkan:9"), "vulkan:9: this machine has"),
        # The drafter's rollback stays inside the FP16 window: the engine names the field.
        (
            dict(kv_cache_dtype="int8", kv_window_tokens=8, speculative_draft_tokens=15),
            "kv_window_tokens 8 must be at least speculative_draft_tokens",
        ),
    ],
)
def test_engine_rejects_values_only_it_can_check(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bi.BieEngine(small_config(**kwargs))


def test_config_is_rechecked_when_the_engine_starts():
    cfg = small_config()
    cfg.max_num_seqs = 0
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        bi.BieEngine(cfg)
    with pytest.raises(ValueError, match="not both"):
        bi.BieEngine(cfg, model="default")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(temperature=-1), "temperature must be >= 0"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(top_p=0), r"top_p must be in \(0, 1\]"),
        (dict(min_p=2), r"min_p must be in \[0, 1\]"),
        (dict(max_tokens=-3), "max_tokens must be >= 0"),
        (dict(stop=[""]), "stop must be a non-empty string"),
        (dict(logprobs=21), "logprobs must be <= 20"),
        (dict(seed=-1), "seed must be >= 0"),
        (dict(repetition_penalty=0), "repetition_penalty must be > 0"),
    ],
)
def test_bad_sampling_params_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bi.SamplingParams(**kwargs)


def test_bad_prompts_raise_value_error(engine):
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.generate("")
    with pytest.raises(ValueError, match="must be a str or a list"):
        engine.generate(42)
    with pytest.raises(ValueError):
        engine.generate([[]])


def test_prompt_beyond_max_model_len_is_out_of_memory(engine):
    long_prompt = "hello " * 1100  # > max_model_len 1024 tokens
    assert len(engine.tokenize(long_prompt)) > 1024
    with pytest.raises(bi.BieOutOfMemory) as info:
        engine.generate(["Hi", long_prompt], bi.SamplingParams(max_tokens=4))
    assert isinstance(info.value, MemoryError)
    assert "max_model_len is 1024" in str(info.value)  # the field, not the CLI flag
    # max_tokens beyond what max_model_len leaves is capped.
    ids = engine.tokenize(long_prompt)[:1016]
    out = engine.generate(ids, bi.SamplingParams(temperature=0, max_tokens=5000, ignore_eos=True))[0]
    assert len(out.token_ids) == 1024 - 1016 and out.finish_reason == "length"
    # The engine is unharmed.
    assert engine.generate("Hello", bi.SamplingParams(temperature=0, max_tokens=4))[0].token_ids


def test_config_beyond_the_budget_is_out_of_memory():
    with pytest.raises(bi.BieOutOfMemory, match="budget"):
        bi.BieEngine(small_config(device_memory="64MiB"))
    with pytest.raises(bi.BieOutOfMemory, match="kv_cache_memory"):
        bi.BieEngine(small_config(kv_cache_memory="1MiB", max_model_len=8192))
