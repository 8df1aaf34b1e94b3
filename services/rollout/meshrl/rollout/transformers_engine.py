"""The embedded default engine: a `transformers` model on CPU or GPU, decoded with continuous batching.

Built by `engine_factory.create_engine` for engine.kind = "transformers". Generation goes through the
`ContinuousBatcher`; weight updates (disk or collective) are received and verified by
`meshrl.common.weights`, then copied into the live parameters between two decoding steps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import FailedPrecondition, InvalidArgument
from meshrl.common.weights import GroupSpec, apply_delta, stage_delta
from meshrl.rollout.batcher import ContinuousBatcher
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.engine import ChunkCallback, Engine
from meshrl.rollout.memory import check_tags, release_parameters, restore_parameters
from meshrl.rollout.model_runner import HFModelRunner
from meshrl.rollout.types import (
    DiskUpdate,
    EngineStatus,
    GenerationRequest,
    GenerationResult,
    GroupUpdate,
    PauseMode,
    WeightUpdateResult,
)
from meshrl.rollout.weight_receiver import WeightReceiver, read_disk


class TransformersEngine(Engine):
    name = "transformers"

    def __init__(self, config: EngineConfig) -> None:
        t = config.transformers
        self.runner = HFModelRunner(
            config.model_path,
            device=t.device,
            dtype=t.dtype,
            attn_implementation=t.attn_implementation,
            context_length=config.context_length,
            num_threads=t.num_threads,
        )
        self.batcher = ContinuousBatcher(
            self.runner,
            max_batch_size=config.max_batch_size,
            max_admit_per_step=t.max_admit_per_step,
            prefix_cache_tokens=t.prefix_cache_tokens,
            max_prefill_tokens=t.max_prefill_tokens,
        )
        self.receiver = WeightReceiver(self.runner.named_parameters, self.runner.device)
        self._update_lock = threading.Lock()
        self._released: set[str] = set()  # memory tags given up while asleep (colocated mode)
        self._released_params: list = []
        self._weights_undefined = False  # weights re-taken but not refilled by an update yet
        self.batcher.start()

    # --- facts ----------------------------------------------------------------------------------
    @property
    def device(self) -> str:
        return str(self.runner.device)

    @property
    def model_path(self) -> str:
        return self.runner.model_path

    @property
    def context_length(self) -> int:
        return self.runner.context_length

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size

    @property
    def weight_version(self) -> int:
        return self.batcher.version

    # --- generation -------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, on_chunk: ChunkCallback | None = None) -> Future[GenerationResult]:
        self._check(request)
        return self.batcher.submit(request, on_chunk)

    def submit_many(self, requests: Sequence[GenerationRequest]) -> list[Future[GenerationResult]]:
        for request in requests:  # all checked before any is queued
            self._check(request)
        return self.batcher.submit_many(requests)

    def _check(self, request: GenerationRequest) -> None:
        self.validate(request)
        bad = [t for t in request.sampling.stop_token_ids if t >= self.vocab_size]
        if bad:
            raise InvalidArgument(f"sampling.stop_token_ids {bad} are outside the vocabulary [0, {self.vocab_size})")

    def cancel(self, request_id: str) -> bool:
        return self.batcher.cancel(request_id)

    # --- weights ------------------------------------------------------------------------------------
    def update_weights_from_disk(self, update: DiskUpdate) -> WeightUpdateResult:
        """Stages and verifies the whole version while generating, then pauses only for the copy."""
        with self._update_lock:
            self._require_weights_memory()
            start = time.perf_counter()
            staged = read_disk(update.path, update.version, update.manifest_sha256, update.staging_dir)
            copy = lambda: self.receiver.apply(staged.tensors, self.batcher.version, update.version)  # noqa: E731
            return self._install(update.version, start, copy, update.pause_mode, update.flush_cache)

    def update_weights_from_delta(self, update: DiskUpdate) -> WeightUpdateResult:
        """Decodes and verifies the delta against the live parameters while generating (BaseMismatch when they
        are not `update.delta_base`'s), then pauses only to copy the changed tensors in."""
        with self._update_lock:
            self._require_weights_memory()
            start = time.perf_counter()
            weights = weights_pb2.DiskWeights(
                path=update.path,
                version=update.version,
                manifest_sha256=update.manifest_sha256,
                delta=True,
                base_version=update.delta_base or 0,
            )
            staged = stage_delta(self.runner.named_parameters(), weights, self.batcher.version)
            copy = lambda: apply_delta(self.runner.named_parameters(), staged)  # noqa: E731
            return self._install(update.version, start, copy, update.pause_mode, update.flush_cache)

    def _install(
        self, version: int, start: float, copy: Callable[[], int], pause_mode: PauseMode, flush_cache: bool
    ) -> WeightUpdateResult:
        """Pauses, runs `copy` (returns the bytes copied into the parameters) between two decoding steps,
        bumps the version, flushes the cache (by policy) and continues; the pause is timed apart."""
        paused = time.perf_counter()
        self.batcher.pause(pause_mode, reason="weights")
        try:

            def install() -> int:
                nbytes = copy()
                self.batcher.version = version
                if flush_cache:
                    self.batcher.drop_cache()
                return nbytes

            nbytes = self.batcher.run_exclusive(install)
        finally:
            self.batcher.resume(reason="weights")
        self._weights_refilled()
        end = time.perf_counter()
        return WeightUpdateResult(version, end - start, nbytes, pause_seconds=end - paused)

    def init_weight_update_group(self, group: GroupSpec) -> int:
        if group.protocol != "meshrl":
            raise InvalidArgument(
                f"the transformers engine receives weight groups of protocol 'meshrl', not {group.protocol!r}"
            )
        return self.receiver.join_group(group)

    def update_weights_from_distributed(self, update: GroupUpdate) -> WeightUpdateResult:
        """A complete version: pauses before its first tensor lands, receives every bucket straight into the
        parameters, flushes (by policy), continues. A delta: received and decoded while generating (refused,
        untouched, when the parameters are not its base's), then paused only to copy the changed tensors in."""
        version = update.version
        with self._update_lock:
            self.receiver.group(update.group_name)  # NotFound before pausing anything
            self._require_weights_memory()
            start = time.perf_counter()
            paused: list[float] = []

            def pause() -> None:
                self.batcher.pause(update.pause_mode, reason="weights")
                paused.append(time.perf_counter())

            try:
                # Paused once a complete version arrives: the batcher runs no forward pass, so the parameters
                # may change under it.
                nbytes, staged = self.receiver.receive_into_model(
                    update.group_name, self.batcher.version, version, update.timeout_seconds, pause
                )
                if staged is None:

                    def bump() -> None:
                        self.batcher.version = version
                        if update.flush_cache:
                            self.batcher.drop_cache()

                    self.batcher.run_exclusive(bump)
            finally:
                if paused:
                    self.batcher.resume(reason="weights")
            if staged is not None:
                copy = lambda: apply_delta(self.runner.named_parameters(), staged)  # noqa: E731
                result = self._install(version, start, copy, update.pause_mode, update.flush_cache)
                return WeightUpdateResult(version, result.seconds, nbytes, pause_seconds=result.pause_seconds)
            self._weights_refilled()
            end = time.perf_counter()
            return WeightUpdateResult(version, end - start, nbytes, pause_seconds=end - paused[0] if paused else 0.0)

    def destroy_weight_update_group(self, group_name: str) -> None:
        self.receiver.leave_group(group_name)

    # --- sleeping (colocated mode) ------------------------------------------------------------------
    def release_memory(self, tags: Sequence[str] = ()) -> list[str]:
        """Gives up the KV cache and/or the weights' memory (SGLang's release_memory_occupation). Refused
        unless idle; generation stays paused until every tag is resumed and the weights were refilled."""
        tags = check_tags(tags)
        with self._update_lock:
            self.batcher.pause(PauseMode.IN_PLACE, reason="sleep")

            def release() -> None:
                if self.batcher.running or self.batcher.queue_depth:
                    raise FailedPrecondition(
                        f"release_memory needs an idle engine; {self.batcher.running} requests run and "
                        f"{self.batcher.queue_depth} wait (finish or abort them first)"
                    )
                self.batcher.drop_cache()  # the prefix cache and any KV
                if "weights" in tags and not self._released_params:
                    self._released_params = release_parameters(self.runner.model.parameters())

            try:
                self.batcher.run_exclusive(release)
            except BaseException:
                if not self._released:
                    self.batcher.resume(reason="sleep")
                raise
            self._released |= set(tags)
            return sorted(self._released)

    def resume_memory(self, tags: Sequence[str] = ()) -> list[str]:
        """Takes memory back (SGLang's resume_memory_occupation); re-taken weights hold nothing until the
        next weight update refills them in place. Returns the tags still released."""
        tags = check_tags(tags)
        with self._update_lock:
            if "weights" in tags and self._released_params:
                self.batcher.run_exclusive(lambda: restore_parameters(self._released_params))
                self._released_params, self._weights_undefined = [], True
            self._released -= set(tags)
            self._wake_if_ready()
            return sorted(self._released)

    def _wake_if_ready(self) -> None:
        if not self._released and not self._weights_undefined:
            self.batcher.resume(reason="sleep")

    def _weights_refilled(self) -> None:
        if self._weights_undefined:
            self._weights_undefined = False
            self._wake_if_ready()

    def _require_weights_memory(self) -> None:
        if self._released_params:
            raise FailedPrecondition("the weights' memory is released (asleep); resume_memory(['weights']) first")

    def weight_checksums(self, names: Sequence[str] = ()) -> tuple[int, dict[str, str]]:
        return self.batcher.run_exclusive(lambda: (self.batcher.version, self.receiver.checksums(names)))

    # --- control ------------------------------------------------------------------------------------
    def pause(self, mode: PauseMode = PauseMode.IN_PLACE) -> int:
        return self.batcher.pause(mode, reason="user")

    def continue_generation(self) -> None:
        self.batcher.resume(reason="user")

    def flush_cache(self) -> bool:
        return self.batcher.flush()

    def health(self) -> bool:
        return self.batcher.alive

    def status(self) -> EngineStatus:
        b = self.batcher
        return EngineStatus(
            engine=self.name,
            model_path=self.model_path,
            weight_version=b.version,
            queue_depth=b.queue_depth,
            running_requests=b.running,
            tokens_per_second=b.tokens_per_second(),
            generated_tokens=b.generated_tokens,
            paused=b.paused,
            healthy=self.health(),
        )

    def tokenize(self, text: str) -> list[int]:
        if self.runner.tokenizer is None:
            raise FailedPrecondition(f"the model folder {self.model_path} has no tokenizer; send prompt_ids instead")
        return list(self.runner.tokenizer.encode(text, add_special_tokens=False))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        if self.runner.tokenizer is None:
            return ""
        return self.runner.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def shutdown(self) -> None:
        self.batcher.stop()
        self.receiver.close()
