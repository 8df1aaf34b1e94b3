"""Token ids of an episode's non-model turns, from the model's own chat template, without re-encoding history.

The first prompt is the chat template applied to the first user message (with the environment's tools).
An environment turn is the text the template puts between the end of an assistant message and the start of
the next assistant message when a message of role `role` comes between them; it is found by rendering a
two-message conversation with and without that message and taking the difference, then encoded on its own.
The model's tokens are never decoded and re-encoded: the trajectory is the engine's ids plus these.
Called by `meshrl.scheduler.step.user.episodes`.
"""

from __future__ import annotations

from typing import Any

from meshrl.common.errors import InvalidArgument

_MARK = "\x00MESHRL\x00"  # a placeholder message body no template touches


class ChatTurns:
    def __init__(self, tokenizer: Any, system_prompt: str | None = None) -> None:
        if not tokenizer.chat_template:
            raise InvalidArgument(
                "a multi-turn ROLLOUT node needs a tokenizer with a chat template (the model folder has none)"
            )
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.eos_ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
        self._cache: dict[str, tuple[str, str]] = {}

    def _render(self, messages: list[dict], generation_prompt: bool, tools: list[dict] | None = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=generation_prompt, tokenize=False
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def first_prompt(self, message: str, tools: list[dict] | None = None) -> list[int]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": message})
        return self._encode(self._render(messages, True, tools))

    def _pieces(self, role: str) -> tuple[str, str]:
        """(what closes an assistant message, what a `role` message + the next assistant header add)."""
        if role not in self._cache:
            base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}]
            closed = self._render(base, False)
            after = closed[closed.index(_MARK) + len(_MARK) :]
            full = self._render([*base, {"role": role, "content": _MARK}], True)
            if not full.startswith(closed):
                raise InvalidArgument(
                    f"the chat template renders earlier messages differently once a {role!r} message follows; "
                    "multi-turn token-in/token-out needs an append-only template"
                )
            self._cache[role] = (after, full[len(closed) :])
        return self._cache[role]

    def observation_ids(self, observation: str, role: str, model_ids: list[int]) -> list[int]:
        """Tokens that follow the model's turn `model_ids`: the rest of the assistant message's closing (its
        end-of-turn token when the model did not emit one), the observation as a `role` message, and the next
        assistant header."""
        after, turn = self._pieces(role)
        closing = after
        if model_ids and int(model_ids[-1]) in self.eos_ids:
            eos_text = self.tokenizer.decode([int(model_ids[-1])], skip_special_tokens=False)
            closing = after[len(eos_text) :] if after.startswith(eos_text) else after
        return self._encode(closing + turn.replace(_MARK, observation))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)
