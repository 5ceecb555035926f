"""The product page's example: a 64k-token context with a 4-bit KV cache, on the default model.

    pip install .            # from the repository root
    scripts/fetch_models.sh  # the default model (SmolLM2-135M-Instruct Q4_1)
    python examples/quickstart.py
"""

from benni_inference import BieEngine, EngineConfig, SamplingParams

engine = BieEngine(
    EngineConfig(
        model="default",
        max_model_len=65536,
        kv_cache_dtype="int4_asym",
        kv_group_size=64,
        kv_sink_tokens=8,
        paged_block_size=16,
        enable_prefix_caching=True,
        chunked_prefill_size=512,
        gpu_memory_utilization=0.90,
        speculative_draft_tokens=5,
    )
)

prompt = (
    "<|im_start|>user\nExplain in two sentences why a long context needs a compressed KV cache."
    "<|im_end|>\n<|im_start|>assistant\n"
)
outputs = engine.generate(prompt, SamplingParams(temperature=0.2, max_tokens=2048))
print(outputs[0].text)
