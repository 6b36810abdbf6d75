"""Qwen3-style chat framing, in token ids.

The prompt and every observation are framed once, turned into ids once, and
appended to the episode's token history; the model's own tokens are appended
as the engine returned them. Nothing is ever re-templated, so the ids the
learner trains on are the ids the engine saw and produced.
"""

from __future__ import annotations

import dataclasses

from tunix_agentic.models.tokenizer import CharTokenizer


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """Frames user prompts and tool observations around the assistant's turns.

    An assistant turn ends with ``<|im_end|>``, which is a stop token and is kept
    in the generated ids so the model learns to end its turn.
    """

    tokenizer: CharTokenizer
    system: str | None = None

    def prompt_text(self, user: str) -> str:
        head = f"<|im_start|>system\n{self.system}<|im_end|>\n" if self.system else ""
        return f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"

    def observation_text(self, observation: str) -> str:
        return f"\n<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n"

    def prompt_ids(self, user: str) -> list[int]:
        return self.tokenizer.encode(self.prompt_text(user))

    def observation_ids(self, observation: str) -> list[int]:
        return self.tokenizer.encode(self.observation_text(observation))

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return (self.tokenizer.im_end_id, self.tokenizer.eos_id)
