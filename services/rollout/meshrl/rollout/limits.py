"""Bounds on what one call may ask of a replica: samples per prompt, prompt rows, samples in all, stop
tokens and prompt text, and how many GenerateStream calls run at once (`meshrl.rollout.stream_slots`). Checked by `RolloutReplica` before any work starts; a call past a bound is
RESOURCE_EXHAUSTED (too much at once) or INVALID_ARGUMENT (malformed) and changes nothing.
"""

from __future__ import annotations

import pydantic

from meshrl.common.config import StrictModel
from meshrl.common.errors import InvalidArgument, ResourceExhausted


class RequestLimits(StrictModel):
    max_n: int = pydantic.Field(1024, ge=1, description="most samples per prompt in one GenerateBatch")
    max_rows: int = pydantic.Field(8192, ge=1, description="most prompt rows in one GenerateBatch")
    max_samples: int = pydantic.Field(65536, ge=1, description="most samples (rows x n) in one GenerateBatch")
    max_stop_token_ids: int = pydantic.Field(64, ge=0, description="most extra stop token ids of one request")
    max_prompt_text_chars: int = pydantic.Field(1 << 20, ge=1, description="most characters of a text prompt")
    max_streams: int = pydantic.Field(
        256,
        ge=1,
        description="most GenerateStream calls served at once, each holding a server thread while it generates; "
        "one more is refused with RESOURCE_EXHAUSTED (256: the scheduler's default multi-turn concurrency)",
    )

    def check_batch(self, n: int, rows: int) -> None:
        if n > self.max_n:
            raise ResourceExhausted(
                f"n = {n} samples per prompt is more than this replica's limits.max_n = {self.max_n}"
            )
        if rows > self.max_rows:
            raise ResourceExhausted(
                f"{rows} prompt rows is more than limits.max_rows = {self.max_rows}: split the batch with row_begin/row_end"
            )
        if n * rows > self.max_samples:
            raise ResourceExhausted(
                f"{rows} rows x n = {n} is {n * rows} samples, more than limits.max_samples = {self.max_samples}: "
                "split the batch with row_begin/row_end"
            )

    def check_stop(self, stop_token_ids: tuple[int, ...]) -> None:
        if len(stop_token_ids) > self.max_stop_token_ids:
            raise InvalidArgument(
                f"sampling.stop_token_ids has {len(stop_token_ids)} ids, more than {self.max_stop_token_ids}",
                field="sampling.stop_token_ids",
            )

    def check_prompt_text(self, text: str) -> None:
        if len(text) > self.max_prompt_text_chars:
            raise InvalidArgument(
                f"prompt_text has {len(text)} characters, more than limits.max_prompt_text_chars = "
                f"{self.max_prompt_text_chars}",
                field="prompt_text",
            )
