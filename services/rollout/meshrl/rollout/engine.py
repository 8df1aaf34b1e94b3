"""The engine interface every generation backend implements (transformers, SGLang, vLLM).

The replica core (`meshrl.rollout.replica`) holds one Engine and calls only these methods;
`engine_factory.create_engine` picks the implementation from the engine config. Request validation that
does not depend on the backend (empty prompt, token ids outside the vocabulary, prompt longer
than the context) lives here so every engine refuses bad input the same way.
"""

from __future__ import annotations

import abc
import queue
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future

from meshrl.common.errors import InvalidArgument
from meshrl.common.weights import BaseMismatch, GroupSpec
from meshrl.rollout.types import (
    DiskUpdate,
    EngineStatus,
    GenerationRequest,
    GenerationResult,
    GroupUpdate,
    PauseMode,
    TokenChunk,
    WeightUpdateResult,
)

ChunkCallback = Callable[[TokenChunk], None]


class Engine(abc.ABC):
    """A generation engine. Thread-safe: the gRPC threads call it concurrently."""

    name: str = "engine"

    # --- facts about the loaded model -----------------------------------------------------
    @property
    @abc.abstractmethod
    def model_path(self) -> str: ...

    @property
    @abc.abstractmethod
    def context_length(self) -> int:
        """Most tokens (prompt + response) one sequence may hold."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def weight_version(self) -> int:
        """The weight version served now (0 = the weights the engine started with)."""

    # --- generation -------------------------------------------------------------------------
    @abc.abstractmethod
    def submit(self, request: GenerationRequest, on_chunk: ChunkCallback | None = None) -> Future[GenerationResult]:
        """Queues a request and returns at once; `on_chunk` (if given) sees every new token as it is made.

        Raises InvalidArgument for a bad request (see `validate`); the future fails with a MeshrlError
        when the engine cannot finish it (e.g. Unavailable when the backend died).
        """

    def submit_many(self, requests: Sequence[GenerationRequest]) -> list[Future[GenerationResult]]:
        """Queues several requests together (validated first: a bad one queues none); engines that batch
        override it so the requests join one step."""
        for request in requests:
            self.validate(request)
        return [self.submit(r) for r in requests]

    @abc.abstractmethod
    def cancel(self, request_id: str) -> bool:
        """Ends a running or queued request with FinishReason.ABORT; False if it is unknown or finished."""

    def generate(self, requests: Sequence[GenerationRequest], timeout: float | None = None) -> list[GenerationResult]:
        """Submits all requests at once (they are batched together) and waits for every result, in order."""
        futures = self.submit_many(requests)
        return [f.result(timeout=timeout) for f in futures]

    def stream(self, request: GenerationRequest) -> Iterator[TokenChunk]:
        """Yields the chunks of one request as they are produced; the last one has a finish_reason."""
        chunks: queue.Queue[TokenChunk] = queue.Queue()
        future = self.submit(request, on_chunk=chunks.put)
        try:
            while True:
                try:
                    chunk = chunks.get(timeout=0.05)
                except queue.Empty:
                    if future.done():
                        future.result()  # raises the engine's error, if any
                        while not chunks.empty():
                            chunk = chunks.get_nowait()
                            yield chunk
                            if chunk.finish_reason is not None:
                                return
                        return
                    continue
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            if not future.done():
                self.cancel(request.request_id)

    # --- weights ----------------------------------------------------------------------------
    @property
    def device(self) -> str:
        """Where the live weights are ("cpu", "cuda:0"); the weight group's backend follows it."""
        return "cpu"

    @property
    def weight_ranks(self) -> int:
        """Ranks this engine holds in a weight-update group (an engine server: one per tensor-parallel worker)."""
        return 1

    # --- sleeping (colocated mode) -----------------------------------------------------------------
    @abc.abstractmethod
    def release_memory(self, tags: Sequence[str] = ()) -> list[str]:
        """Gives up "weights" and/or "kv_cache" memory (empty = both) while idle; generation waits until
        they are resumed (and released weights refilled by an update). Returns the tags now released."""

    @abc.abstractmethod
    def resume_memory(self, tags: Sequence[str] = ()) -> list[str]:
        """Takes the tags' memory back; returns the tags still released."""

    @abc.abstractmethod
    def update_weights_from_disk(self, update: DiskUpdate) -> WeightUpdateResult:
        """Loads a published weight folder (manifest + safetensors) into the live model as `update.version`.

        `staging_dir` (optional): copy the folder there first, while generation continues, then load the copy.
        Refuses (keeping the old weights) a version not above the current one, a manifest whose sha256
        differs from `manifest_sha256` (when given), a checksum, name or shape mismatch.
        """

    def update_weights_from_delta(self, update: DiskUpdate) -> WeightUpdateResult:
        """Applies a delta folder (meshrl.common.weights.delta) against `update.delta_base` as `update.version`.

        Engines that only load complete model folders refuse it with BaseMismatch, and the scheduler
        refits them with a complete version; the transformers engine applies it in place.
        """
        raise BaseMismatch(
            f"the {self.name} engine loads complete weight versions only; weight version {update.version} is a delta "
            "(set weights.delta: false for this fleet)"
        )

    @abc.abstractmethod
    def init_weight_update_group(self, group: GroupSpec) -> int:
        """Joins the trainer's weight-update process group; returns this engine's first rank."""

    @abc.abstractmethod
    def update_weights_from_distributed(self, update: GroupUpdate) -> WeightUpdateResult:
        """Receives one weight version over the joined group (bucket metadata, then the broadcast)."""

    @abc.abstractmethod
    def destroy_weight_update_group(self, group_name: str) -> None: ...

    @abc.abstractmethod
    def weight_checksums(self, names: Sequence[str] = ()) -> tuple[int, dict[str, str]]:
        """(version, {HF tensor name: sha256 hex}) over `names`, or a fixed sample of tensors when empty."""

    # --- control ----------------------------------------------------------------------------
    @abc.abstractmethod
    def pause(self, mode: PauseMode = PauseMode.IN_PLACE) -> int:
        """Stops generating; returns how many in-flight requests were aborted (0 in IN_PLACE mode)."""

    @abc.abstractmethod
    def continue_generation(self) -> None: ...

    @abc.abstractmethod
    def flush_cache(self) -> bool:
        """Drops cached KV state (prefix cache; in-flight requests recompute theirs); False if refused."""

    @abc.abstractmethod
    def health(self) -> bool: ...

    @abc.abstractmethod
    def status(self) -> EngineStatus: ...

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[int]: ...

    @abc.abstractmethod
    def detokenize(self, token_ids: Sequence[int]) -> str: ...

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Aborts what is running and releases the model (and the backend process, if any)."""

    # --- shared validation ------------------------------------------------------------------
    def validate(self, request: GenerationRequest) -> None:
        """Raises InvalidArgument with the reason when the request cannot be served by this engine."""
        prompt = request.prompt_ids
        if len(prompt) == 0:
            raise InvalidArgument("the prompt is empty: give at least one prompt token id (or prompt text)")
        request.sampling.validate()
        vocab = self.vocab_size
        bad = [t for t in prompt if not 0 <= int(t) < vocab]
        if bad:
            raise InvalidArgument(
                f"prompt token ids {bad[:5]} are outside the model's vocabulary [0, {vocab}); "
                "tokenize with this model's tokenizer"
            )
        if len(prompt) >= self.context_length:
            raise InvalidArgument(
                f"the prompt has {len(prompt)} tokens but the model's context holds {self.context_length} "
                f"(prompt + response); shorten the prompt to at most {self.context_length - 1} tokens"
            )
