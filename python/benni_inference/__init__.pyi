from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

__version__: str

class BieOutOfMemory(MemoryError):
    """A request or configuration does not fit the memory budget."""

@dataclass
class EngineConfig:
    model: str = "default"
    max_model_len: int = 0
    kv_cache_dtype: str = "f16"
    kv_cache_dtype_k: Optional[str] = None
    kv_cache_dtype_v: Optional[str] = None
    kv_group_size: int = 64
    kv_sink_tokens: int = 8
    kv_window_tokens: int = 128
    paged_block_size: int = 0
    enable_prefix_caching: bool = True
    chunked_prefill_size: int = 512
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 0
    gpu_memory_utilization: float = 0.90
    device_memory: Optional[Union[int, str]] = None
    kv_cache_memory: Optional[Union[int, str]] = None
    threads: int = 0
    speculative_draft_tokens: int = 0
    speculative_ngram_min: int = 2
    speculative_ngram_max: int = 3
    speculative_adaptive: bool = False
    speculative_model: Optional[str] = None
    speculative_lookup: bool = True
    speculative_draft_vocab: int = 0
    speculative_always: bool = False
    kv_regimes: Optional[List[str]] = None
    kv_policy: Optional[str] = None
    kv_fallback_entropy: float = 0.0
    kv_fallback_regime: str = "int8"
    kv_rotate: Optional[bool] = None
    max_queue: int = 256
    check_integrity: bool = False
    device: str = "auto"
    def validate(self) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...

@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    max_tokens: int = 128
    stop: Optional[Union[str, List[str]]] = None
    seed: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    penalty_last_n: int = 64
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    kv_cache_dtype: Optional[str] = None
    def validate(self) -> None: ...

@dataclass
class RequestMetrics:
    ttft: float = 0.0
    tokens_per_second: float = 0.0
    kv_regime: str = ""
    cached_tokens: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    queue_seconds: float = 0.0
    total_seconds: float = 0.0
    acceptance_rate: Optional[float] = None
    attn_entropy: Optional[float] = None
    kv_fallback: bool = False
    draft_tokens: int = 0
    accepted_tokens: int = 0

@dataclass
class RequestOutput:
    prompt: str
    prompt_token_ids: List[int]
    text: str
    token_ids: List[int]
    finish_reason: str
    metrics: RequestMetrics = ...
    logprobs: Optional[List[float]] = None
    top_logprobs: Optional[List[List[Tuple[int, float]]]] = None

Message = Mapping[str, str]
Prompt = Union[str, Sequence[int]]

class BieEngine:
    config: EngineConfig
    def __init__(self, config: Optional[EngineConfig] = None, **kwargs: Any) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> BieEngine: ...
    def __exit__(self, *exc: Any) -> None: ...
    def generate(
        self, prompts: Union[Prompt, Sequence[Prompt]], params: Optional[SamplingParams] = None
    ) -> List[RequestOutput]: ...
    def stream(self, prompt: Prompt, params: Optional[SamplingParams] = None) -> Iterator[str]: ...
    def chat(
        self,
        messages: Union[Sequence[Message], Sequence[Sequence[Message]]],
        params: Optional[SamplingParams] = None,
    ) -> List[RequestOutput]: ...
    def tokenize(
        self, text: str, add_special_tokens: bool = True, parse_special: bool = True
    ) -> List[int]: ...
    def detokenize(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...
    def plan(self) -> Dict[str, Any]: ...
    def model_info(self) -> Dict[str, Any]: ...
    def metrics(self) -> Dict[str, Any]: ...
    def kv_policy(self) -> Dict[str, Any]: ...
    def set_force_f16(self, on: bool) -> None: ...
