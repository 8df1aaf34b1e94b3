"""Which engine a replica runs: `create_engine` builds the implementation that `engine.kind` names. Kept apart
from the interface (engine.py) so that the engines import the interface and nothing imports back."""

from __future__ import annotations

from meshrl.common.errors import InvalidArgument
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.engine import Engine


def create_engine(config: EngineConfig) -> Engine:
    """The engine named by `config.kind`, loaded and ready."""
    if config.kind == "transformers":
        from meshrl.rollout.transformers_engine import TransformersEngine

        return TransformersEngine(config)
    if config.kind == "sglang":
        from meshrl.rollout.sglang_engine import SGLangEngine

        return SGLangEngine(config)
    if config.kind == "vllm":
        from meshrl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(config)
    raise InvalidArgument(f"engine.kind = {config.kind!r}: use transformers, sglang or vllm")
