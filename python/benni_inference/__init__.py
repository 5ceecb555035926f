"""benni_inference: the Python SDK of BIE (Benni Inference Engine).

BIE keeps long contexts inside a fixed memory budget: a paged KV cache whose old tokens are stored
in 4/8-bit formats while the first ("sink") tokens and a recent window stay in FP16, prefix sharing
between requests, and continuous batching. This package drives the engine in-process::

    from benni_inference import BieEngine, EngineConfig, SamplingParams

    engine = BieEngine(EngineConfig(model="default", kv_cache_dtype="int4_asym"))
    outputs = engine.generate("The capital of France is", SamplingParams(temperature=0.2))
    print(outputs[0].text)

Errors: ``ValueError`` for bad arguments, :class:`BieOutOfMemory` (a ``MemoryError``) when a
request or the configuration does not fit the memory budget, ``RuntimeError`` otherwise.
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from . import _bie
from ._bie import BieOutOfMemory

__all__ = [
    "BieEngine",
    "BieOutOfMemory",
    "EngineConfig",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
]

__version__ = "0.1.0"

BieOutOfMemory.__doc__ = (
    "A request or configuration does not fit the memory budget (KV cache, max_model_len, "
    "device memory). A subclass of MemoryError."
)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_int(name: str, v: Any, lo: Optional[int] = None, hi: Optional[int] = None) -> None:
    if not _is_int(v):
        raise ValueError(f"{name} must be an int, got {v!r}")
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be <= {hi}, got {v}")


def _check_byte_size(name: str, v: Any) -> None:
    if v is None:
        return
    if _is_int(v):
        if v <= 0:
            raise ValueError(f"{name} must be > 0 bytes, got {v}")
        return
    if not isinstance(v, str) or not v:
        raise ValueError(f"{name} must be a byte count or a size such as '2GiB', got {v!r}")


_FLAG_NAMES = {"kv-window": "kv_window_tokens"}


def _python_names(message: str) -> str:
    """Engine messages name CLI flags (--max-model-len); say the EngineConfig field instead."""

    def repl(m: "re.Match[str]") -> str:
        flag = m.group(1)
        return _FLAG_NAMES.get(flag, flag.replace("-", "_"))

    return re.sub(r"--([a-z][a-z0-9-]*)", repl, message)


@dataclass
class EngineConfig:
    """How to start a :class:`BieEngine`: the model, the KV-cache regime and the memory budget.

    The fields mirror ``bie-serve``'s flags (``--kv-cache-dtype`` is ``kv_cache_dtype``, ...).
    Values are checked when the config is built and again when an engine starts; a bad value raises
    ``ValueError`` naming the field.

    Attributes:
        model: path to a GGUF file, or ``"default"`` (SmolLM2-135M-Instruct Q4_1, fetched by
            ``scripts/fetch_models.sh`` into ``~/.cache/bie/models``).
        max_model_len: tokens per sequence (prompt + output); 0 = min(model's trained context, 8192).
        kv_cache_dtype: KV storage format of the body (tokens outside the sink and window):
            ``"f16"``, ``"int8"``, ``"fp8_e4m3"``, ``"int4_asym"`` (= ``"int4"``: per-channel int4 keys over
            64-token blocks, int4 values in groups of 64), ``"int4_asym_g64"`` (the per-token recipe: K and
            V int4 groups along the head, keys rotated), ``"q8_0"``, ``"q4_0"``.
        kv_cache_dtype_k: format of K only (overrides kv_cache_dtype); None: from kv_cache_dtype.
        kv_cache_dtype_v: format of V only; None: from kv_cache_dtype.
        kv_group_size: int4_asym values per (scale, zero) group: 32, 64 or 128.
        kv_sink_tokens: first tokens of every sequence kept in FP16 (attention sinks).
        kv_window_tokens: most recent tokens kept in FP16.
        paged_block_size: tokens per KV block (0: 64 for "int8", "int4_asym" and layer maps, else 16).
        enable_prefix_caching: share identical prompt prefixes between requests.
        chunked_prefill_size: prompt tokens per forward pass (bounds activation memory).
        max_num_seqs: sequences run at once (they share the KV pools, admitted by free blocks;
            the budget must hold at least one sequence of max_model_len).
        max_num_batched_tokens: tokens one engine step may schedule; 0 = automatic.
        gpu_memory_utilization: share of device memory the engine may use, in (0, 1].
        device_memory: device memory in bytes or as a size ("16GiB"); None = physical RAM.
        kv_cache_memory: bytes for the KV pools (int or "2GiB"); overrides the budget above.
        threads: compute threads; 0 = all hardware threads.
        speculative_draft_tokens: draft tokens per step for speculative decoding with the
            prompt-lookup n-gram drafter (0 = off; 1..15). Greedy output is unchanged; sampled
            output keeps its distribution (exact rejection sampling).
        speculative_ngram_min, speculative_ngram_max: suffix lengths the drafter matches.
        speculative_adaptive: shrink the draft length after rejections, grow it after acceptances.
        speculative_model: a draft model GGUF with the target's vocabulary that drafts instead of
            the n-gram matcher (its weights and KV cache come out of the memory budget).
        speculative_lookup: with speculative_model, prompt lookup (free) proposes first where the
            cost model expects more from it than from the draft model (default True).
        speculative_draft_vocab: the draft model's output layer reads its first N rows (0: all);
            ids of the request's own text above N are scored apart.
        speculative_always: draft every step without asking the cost model (tests, measurements).
        kv_regimes: further KV formats requests may ask for (``SamplingParams.kv_cache_dtype``);
            f16 is always one (the kill switch, :meth:`BieEngine.set_force_f16`).
        kv_policy: KV format by request length (prompt + max_tokens), e.g.
            ``"int4_asym:0-16384,int8:16384-"``; lengths no range covers use kv_cache_dtype.
        kv_fallback_entropy: in (0, 1]: a request in the default regime whose attention at the
            prompt's last token is spiky (entropy proxy below this) is recomputed in
            kv_fallback_regime before its first token (``bie-serve --kv-fallback-entropy``);
            0 = off. CPU only.
        kv_fallback_regime: the KV format spiky requests fall back to.
        kv_rotate: Hadamard-rotate K and Q; None = on for per-token int4_asym_gN keys.
        kv_layer_map: path of a per-layer KV format map (``bie quality --calibrate`` writes one);
            each layer's body formats replace kv_cache_dtype's. None = no map.
        max_queue: requests waiting for admission before submission is refused.
        check_integrity: verify the scheduler's and KV block manager's invariants after every
            step (slow; for tests and debugging).
        device: where the model runs, as ``bie --device``: ``"auto"`` (a real GPU when this
            machine has one, else the CPU; never a CPU-type Vulkan device such as lavapipe),
            ``"cpu"``, ``"vulkan"`` or ``"vulkan:N"``. On a GPU the memory budget is the
            device's memory and the KV cache is f16.
    """

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
    kv_layer_map: Optional[str] = None
    max_queue: int = 256
    check_integrity: bool = False
    device: str = "auto"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the first field with a bad value."""
        if isinstance(self.model, os.PathLike):
            self.model = os.fspath(self.model)
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a GGUF path or 'default', got {self.model!r}")
        _check_int("max_model_len", self.max_model_len, 0, 1 << 24)
        for name in ("kv_cache_dtype", "kv_cache_dtype_k", "kv_cache_dtype_v"):
            v = getattr(self, name)
            if v is None and name != "kv_cache_dtype":
                continue
            if not isinstance(v, str) or not v:
                raise ValueError(f"{name} must be a KV format name such as 'int4_asym', got {v!r}")
        _check_int("kv_group_size", self.kv_group_size, 1)
        if self.kv_group_size not in (32, 64, 128):
            raise ValueError(f"kv_group_size must be 32, 64 or 128, got {self.kv_group_size}")
        _check_int("kv_sink_tokens", self.kv_sink_tokens, 0)
        _check_int("kv_window_tokens", self.kv_window_tokens, 0)
        _check_int("paged_block_size", self.paged_block_size, 0)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(
                f"enable_prefix_caching must be True or False, got {self.enable_prefix_caching!r}"
            )
        _check_int("chunked_prefill_size", self.chunked_prefill_size, 1, 8192)
        _check_int("max_num_seqs", self.max_num_seqs, 1, 1 << 16)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 0)
        u = self.gpu_memory_utilization
        if not _is_number(u) or not 0.0 < u <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {u!r}")
        _check_byte_size("device_memory", self.device_memory)
        _check_byte_size("kv_cache_memory", self.kv_cache_memory)
        _check_int("threads", self.threads, 0, 1024)
        _check_int("speculative_draft_tokens", self.speculative_draft_tokens, 0, 15)
        _check_int("speculative_ngram_min", self.speculative_ngram_min, 1, 16)
        _check_int("speculative_ngram_max", self.speculative_ngram_max, self.speculative_ngram_min, 16)
        if not isinstance(self.speculative_adaptive, bool):
            raise ValueError(
                f"speculative_adaptive must be True or False, got {self.speculative_adaptive!r}"
            )
        if self.kv_regimes is not None and not (
            isinstance(self.kv_regimes, (list, tuple)) and all(isinstance(x, str) for x in self.kv_regimes)
        ):
            raise ValueError(f"kv_regimes must be a list of format names, got {self.kv_regimes!r}")
        if self.kv_policy is not None and not isinstance(self.kv_policy, str):
            raise ValueError(f"kv_policy must be a string such as 'int4_asym:0-16384,int8:16384-', got {self.kv_policy!r}")
        e = self.kv_fallback_entropy
        if not _is_number(e) or not 0.0 <= e <= 1.0:
            raise ValueError(f"kv_fallback_entropy must be in [0, 1] (0: off), got {e!r}")
        if not isinstance(self.kv_fallback_regime, str) or not self.kv_fallback_regime:
            raise ValueError(
                f"kv_fallback_regime must be a KV format name such as 'int8', got {self.kv_fallback_regime!r}"
            )
        if self.speculative_model is not None and not isinstance(self.speculative_model, str):
            raise ValueError(
                f"speculative_model must be a path or None, got {self.speculative_model!r}"
            )
        for name in ("speculative_lookup", "speculative_always"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        v = self.speculative_draft_vocab
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"speculative_draft_vocab must be an int >= 0 (0: all), got {v!r}")
        if self.kv_rotate is not None and not isinstance(self.kv_rotate, bool):
            raise ValueError(f"kv_rotate must be True, False or None, got {self.kv_rotate!r}")
        if isinstance(self.kv_layer_map, os.PathLike):
            self.kv_layer_map = os.fspath(self.kv_layer_map)
        if self.kv_layer_map is not None and not (isinstance(self.kv_layer_map, str) and self.kv_layer_map):
            raise ValueError(f"kv_layer_map must be a file path or None, got {self.kv_layer_map!r}")
        _check_int("max_queue", self.max_queue, 1)
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device must be 'auto', 'cpu', 'vulkan' or 'vulkan:N', got {self.device!r}")
        if not isinstance(self.check_integrity, bool):
            raise ValueError(f"check_integrity must be True or False, got {self.check_integrity!r}")

    def to_dict(self) -> Dict[str, Any]:
        """The fields as a plain dict."""
        return asdict(self)


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop.

    Greedy when ``temperature`` is 0. Otherwise llama.cpp's chain: penalties -> top-k -> top-p ->
    min-p -> temperature -> draw.

    Attributes:
        temperature: 0 = greedy (deterministic); higher = more random.
        top_p: nucleus sampling threshold in (0, 1]; 1 = off.
        top_k: keep the k most likely tokens; 0 or -1 = off.
        min_p: drop tokens below min_p x the best token's probability; 0 = off.
        max_tokens: tokens to generate at most; 0 = up to max_model_len.
        stop: a string or strings; generation ends before the first match (not included).
        seed: RNG seed (same seed, same output); None = a random seed per call.
        presence_penalty: subtracted once from tokens that appeared (OpenAI style).
        frequency_penalty: subtracted per occurrence.
        repetition_penalty: llama.cpp's repeat penalty; 1 = off.
        penalty_last_n: how many recent tokens the penalties look at; -1 = all.
        ignore_eos: keep generating past end-of-generation tokens.
        logprobs: None = no log-probabilities; 0 = the chosen token's; k = plus the top k (<= 20).
        kv_cache_dtype: the KV regime to run in (one of the engine's: its kv_cache_dtype, "f16",
            kv_regimes, kv_policy formats); None = the length policy, else the default.
    """

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

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the first field with a bad value."""
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            if not _is_number(getattr(self, name)):
                raise ValueError(f"{name} must be a number, got {getattr(self, name)!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k, -1)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        _check_int("max_tokens", self.max_tokens, 0)
        _check_int("penalty_last_n", self.penalty_last_n, -1)
        if self.stop is not None:
            stops = [self.stop] if isinstance(self.stop, str) else self.stop
            if not isinstance(stops, (list, tuple)) or not all(
                isinstance(s, str) and s for s in stops
            ):
                raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, (1 << 64) - 1)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, 20)
        if self.kv_cache_dtype is not None and not isinstance(self.kv_cache_dtype, str):
            raise ValueError(f"kv_cache_dtype must be a format name or None, got {self.kv_cache_dtype!r}")

    def _native(self, extra_stop: Sequence[str] = ()) -> Dict[str, Any]:
        self.validate()
        stops = [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return {
            "temperature": float(self.temperature),
            "top_p": float(self.top_p),
            "top_k": max(self.top_k, 0),
            "min_p": float(self.min_p),
            "max_tokens": self.max_tokens,
            "stop": stops + [s for s in extra_stop if s and s not in stops],
            "seed": self.seed if self.seed is not None else random.getrandbits(63),
            "presence_penalty": float(self.presence_penalty),
            "frequency_penalty": float(self.frequency_penalty),
            "repetition_penalty": float(self.repetition_penalty),
            "penalty_last_n": self.penalty_last_n,
            "ignore_eos": self.ignore_eos,
            "logprobs": -1 if self.logprobs is None else self.logprobs,
            "kv_cache_dtype": self.kv_cache_dtype or "",
        }


@dataclass
class RequestMetrics:
    """Timings and cache facts of one request.

    Attributes:
        ttft: seconds from submission to the first token.
        tokens_per_second: decode speed (tokens after the first / their time).
        kv_regime: the KV layout the request ran in, e.g. ``"k=int4_channel_t64 v=int4_asym_g64"``.
        cached_tokens: prompt tokens served from the prefix cache.
        prompt_tokens, generated_tokens, preemptions, queue_seconds, total_seconds: as named.
        acceptance_rate: share of draft tokens accepted when speculating; None otherwise.
        draft_tokens, accepted_tokens: speculative proposals verified, and of those accepted.
        attn_entropy: the attention-entropy proxy at the prompt's last token when the engine
            measured it (``kv_fallback_entropy``); None otherwise.
        kv_fallback: the request's attention was spiky and it ran in the fallback regime.
    """

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
    draft_tokens: int = 0
    accepted_tokens: int = 0
    attn_entropy: Optional[float] = None
    kv_fallback: bool = False


@dataclass
class RequestOutput:
    """The result of one prompt.

    Attributes:
        prompt: the prompt text (for chat, the rendered template).
        prompt_token_ids: the prompt's token ids as the engine saw them.
        text: the generated text (without the stop string that ended it).
        token_ids: the generated token ids.
        finish_reason: ``"stop"`` (end of generation or a stop string), ``"length"`` (max_tokens
            or max_model_len), ``"cancelled"``.
        metrics: a :class:`RequestMetrics`.
        logprobs: per generated token, its log-probability (when requested).
        top_logprobs: per generated token, ``[(token_id, logprob), ...]`` best first (when asked).
    """

    prompt: str
    prompt_token_ids: List[int]
    text: str
    token_ids: List[int]
    finish_reason: str
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    logprobs: Optional[List[float]] = None
    top_logprobs: Optional[List[List[tuple]]] = None


def _output(prompt: str, ids: List[int], d: Mapping[str, Any]) -> RequestOutput:
    m = d["metrics"]
    known = {f.name for f in fields(RequestMetrics)}
    return RequestOutput(
        prompt=prompt,
        prompt_token_ids=ids,
        text=d["text"],
        token_ids=list(d["token_ids"]),
        finish_reason=d["finish_reason"],
        metrics=RequestMetrics(**{k: v for k, v in m.items() if k in known}),
        logprobs=d.get("logprobs"),
        top_logprobs=d.get("top_logprobs"),
    )


def _translate_errors(fn):
    """Rewrites engine messages to name EngineConfig fields rather than CLI flags."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, MemoryError, RuntimeError) as e:
            if e.args and isinstance(e.args[0], str) and "--" in e.args[0]:
                e.args = (_python_names(e.args[0]),) + e.args[1:]
            raise

    return wrapper


Message = Mapping[str, str]


# Roles a chat message may have (OpenAI's; "developer" is its newer name for "system").
_CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


class BieEngine:
    """An inference engine: a loaded model, its paged KV cache and a continuous-batching scheduler
    running on its own thread.

    Methods block the calling Python thread with the GIL released, so other Python threads keep
    running; several threads may call one engine at once and their requests are batched together.
    Ctrl-C during :meth:`generate` or :meth:`stream` cancels the requests and raises
    ``KeyboardInterrupt``. Use it as a context manager, or call :meth:`close`, to stop the engine
    and its threads.

    Example::

        with BieEngine(EngineConfig(model="default")) as engine:
            print(engine.generate("Once upon a time", SamplingParams(max_tokens=32))[0].text)
    """

    @_translate_errors
    def __init__(self, config: Optional[EngineConfig] = None, **kwargs: Any) -> None:
        """Loads the model and sizes the KV pools.

        Args:
            config: an :class:`EngineConfig`; keyword arguments build one instead
                (``BieEngine(model="default", kv_cache_dtype="int8")``).

        Raises:
            ValueError: a bad config value, or a model file that does not exist.
            BieOutOfMemory: the weights and workspace, or one sequence of max_model_len, do not
                fit the budget.
            RuntimeError: the model cannot be loaded.
        """
        if config is None:
            config = EngineConfig(**kwargs)
        elif kwargs:
            raise ValueError("give either an EngineConfig or keyword arguments, not both")
        if not isinstance(config, EngineConfig):
            raise ValueError(f"config must be an EngineConfig, got {type(config).__name__}")
        config.validate()
        self.config = config
        self._engine = _bie.Engine(config.to_dict())

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the engine: running requests are cancelled and its threads exit. Idempotent."""
        self._engine.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return self._engine.closed

    def __enter__(self) -> "BieEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close()

    # -- generation ------------------------------------------------------------------------------

    def _prompt_ids(self, prompt: Union[str, Sequence[int]]) -> List[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            return self._engine.tokenize(prompt, True, True)
        if isinstance(prompt, (list, tuple)) and all(_is_int(t) for t in prompt):
            return list(prompt)
        raise ValueError(f"a prompt must be a str or a list of token ids, got {type(prompt).__name__}")

    @_translate_errors
    def generate(
        self,
        prompts: Union[str, Sequence[int], Sequence[Union[str, Sequence[int]]]],
        params: Optional[SamplingParams] = None,
    ) -> List[RequestOutput]:
        """Generates a completion for each prompt.

        All prompts are submitted together, so the scheduler batches them (continuous batching);
        the call returns when every one has finished.

        Args:
            prompts: a prompt string, a list of prompt strings, or token ids (a list of ints or a
                list of such lists). Special-token text such as ``<|im_start|>`` is parsed.
            params: sampling and stopping; defaults to ``SamplingParams()``.

        Returns:
            One :class:`RequestOutput` per prompt, in order.

        Raises:
            ValueError: a bad prompt or parameter.
            BieOutOfMemory: a prompt that leaves no room within max_model_len (a larger
                max_tokens than what is left is capped, not refused).
            KeyboardInterrupt: Ctrl-C; the batch is cancelled first.
        """
        params = params if params is not None else SamplingParams()
        if isinstance(prompts, str) or (
            isinstance(prompts, (list, tuple)) and prompts and all(_is_int(t) for t in prompts)
        ):
            batch = [prompts]
        elif isinstance(prompts, (list, tuple)):
            batch = list(prompts)
        else:
            raise ValueError(f"prompts must be a str or a list, got {type(prompts).__name__}")
        texts = [p if isinstance(p, str) else None for p in batch]
        ids = [self._prompt_ids(p) for p in batch]
        results = self._engine.generate(ids, params._native())
        return [
            _output(t if t is not None else self._engine.detokenize(i, False), i, r)
            for t, i, r in zip(texts, ids, results)
        ]

    @_translate_errors
    def stream(
        self, prompt: Union[str, Sequence[int]], params: Optional[SamplingParams] = None
    ) -> Iterator[str]:
        """Generates a completion for one prompt, yielding text pieces as they are produced.

        The pieces concatenate to what :meth:`generate` returns for the same prompt and params.
        Breaking out of the loop (or closing the generator) cancels the request.

        Args:
            prompt: a prompt string or token ids.
            params: sampling and stopping; defaults to ``SamplingParams()``.

        Yields:
            str: text pieces (complete UTF-8 characters).
        """
        params = params if params is not None else SamplingParams()
        native = self._engine.stream(self._prompt_ids(prompt), params._native())
        return _stream_pieces(native)

    def _chat_prompt(self, messages: Sequence[Message]) -> "tuple[List[int], str]":
        if isinstance(messages, Mapping):
            messages = [messages]
        pairs = []
        for m in messages:
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise ValueError(f"a chat message is a dict with 'role' and 'content', got {m!r}")
            if not isinstance(m["content"], str):
                raise ValueError("message content must be a str")
            # The model's Jinja template renders whatever role it is given; refuse the ones
            # OpenAI does not define, as the server does.
            if m["role"] not in _CHAT_ROLES:
                raise ValueError(
                    f"unknown chat role {m['role']!r} (expected one of {', '.join(_CHAT_ROLES)})")
            pairs.append(("system" if m["role"] == "developer" else str(m["role"]), m["content"]))
        return self._engine.render_chat(pairs)

    @_translate_errors
    def chat(
        self,
        messages: Union[Sequence[Message], Sequence[Sequence[Message]]],
        params: Optional[SamplingParams] = None,
    ) -> List[RequestOutput]:
        """Answers a conversation with the model's chat template (ChatML, Gemma, Llama 3).

        Args:
            messages: ``[{"role": "system"|"user"|"assistant", "content": "..."}, ...]``, or a list
                of such conversations (batched together).
            params: sampling and stopping; defaults to ``SamplingParams()``.

        Returns:
            One :class:`RequestOutput` per conversation; ``.prompt`` is the rendered template.
        """
        params = params if params is not None else SamplingParams()
        convs = (
            [messages]
            if isinstance(messages, Mapping) or (messages and isinstance(messages[0], Mapping))
            else list(messages)
        )
        rendered = [self._chat_prompt(c) for c in convs]
        eot = rendered[0][1] if rendered else ""
        ids = [r[0] for r in rendered]
        results = self._engine.generate(ids, params._native(extra_stop=[eot]))
        return [
            _output(self._engine.detokenize(i, False), i, r) for i, r in zip(ids, results)
        ]

    # -- tokenizer and reports -------------------------------------------------------------------

    def tokenize(self, text: str, add_special_tokens: bool = True, parse_special: bool = True) -> List[int]:
        """Token ids of ``text`` (with BOS where the model adds one, and special-token text parsed)."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return self._engine.tokenize(text, add_special_tokens, parse_special)

    def detokenize(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids``; special tokens are dropped unless skip_special_tokens=False."""
        return self._engine.detokenize(list(token_ids), skip_special_tokens)

    def plan(self) -> Dict[str, Any]:
        """The engine's memory plan (its start-up report) as a dict.

        Keys include ``kv_regime``, ``max_model_len``, ``max_num_seqs``, ``weights_bytes``,
        ``workspace_bytes``, ``kv_budget_bytes``, ``kv_pool_bytes``, ``bytes_per_token``,
        ``fp16_blocks``, ``body_blocks``, ``tokens_fit``, ``max_concurrency`` and ``report``
        (the three-line text ``bie run`` prints).
        """
        return self._engine.plan()

    def model_info(self) -> Dict[str, Any]:
        """The loaded model: ``id``, ``path``, ``arch``, ``n_vocab``, ``max_model_len``,
        ``chat_template`` (the family used by :meth:`chat`)."""
        return self._engine.model_info()

    def metrics(self) -> Dict[str, Any]:
        """A snapshot of the engine's counters: pools, running/waiting requests, tokens, prefix hits."""
        return self._engine.metrics()

    def kv_policy(self) -> Dict[str, Any]:
        """The KV regimes (``name``, ``kv`` label, ``max_tokens`` the budget holds in each), the
        length ``policy``, the kill switch ``force_f16`` and ``budget_bytes``."""
        return self._engine.kv_policy()

    def set_force_f16(self, on: bool) -> None:
        """The kill switch: while on, every new request runs in f16 KV whatever it asks for."""
        if not isinstance(on, bool):
            raise ValueError(f"set_force_f16 wants True or False, got {on!r}")
        self._engine.set_force_f16(on)


def _stream_pieces(native: Any) -> Iterator[str]:
    try:
        for piece in native:
            yield piece
    finally:
        native.cancel()
