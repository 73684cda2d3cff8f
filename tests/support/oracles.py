"""Stand-in decoders for checking the scorer: one that reads the answer from the context, one that knows nothing."""

from __future__ import annotations

import re

import torch
from torch import nn

PASSKEY = re.compile(r"The pass key is (\d+)\. Remember it\.")
QUESTION = re.compile(r"What is the special magic number for (\S+) mentioned in the provided text\?")


class OracleDecoder(nn.Module):
    """Answers from the context before the question, as a perfect retriever would: the pass key line, or the
    needle whose key the question names (distractors carry other keys). Only the answer positions are predicted;
    nothing is read from the answer tokens themselves."""

    def __init__(self, tokenizer, vocab_size: int) -> None:
        super().__init__()
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.lm_head = nn.Identity()
        self.anchor = nn.Parameter(torch.zeros(()))  # gives the scorer a device to read

    def _answer(self, text: str) -> str:
        question = QUESTION.search(text)
        if question:
            key = re.escape(question.group(1))
            return re.search(rf"magic numbers for {key} is: (\d+)\.", text[: question.start()]).group(1)
        return PASSKEY.search(text[: text.rindex("What is the pass key?")]).group(1)

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(*tokens.shape, self.vocab_size)
        for row, sequence in enumerate(tokens.tolist()):
            answer = self.tokenizer(
                f" {self._answer(self.tokenizer.decode(sequence))}", add_special_tokens=False
            ).input_ids
            start = len(sequence) - len(answer)
            for offset, token in enumerate(answer):
                out[row, start - 1 + offset, token] = 1.0
        return out
