"""The clock every serving backend times its generations by."""

from __future__ import annotations

import time


class Clock:
    """Times generations of the models on the same seeded random prompt rows; a subclass
    says how to generate (:meth:`generate`) and count the tokens generated (:meth:`generated`)."""

    def __init__(self, device, vocab_size: int, prompt_tokens: int, seed: int):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.prompt_tokens = prompt_tokens
        self.generator = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.prompts: dict[int, object] = {}
        self.bar = None  # a tqdm bar counting generated tokens, set by serve_cost

    def planned(self, tokens: int) -> None:
        """Add generations of ``tokens`` generated tokens in all to the bar's total."""
        if self.bar is not None:
            self.bar.total += tokens
            self.bar.refresh()

    def prompt(self, batch: int):
        """The same random prompt rows for every model (special ids below 16 avoided)."""
        if batch not in self.prompts:
            ids = self.torch.randint(16, self.vocab_size, (batch, self.prompt_tokens), generator=self.generator)
            self.prompts[batch] = ids.to(self.device)
        return self.prompts[batch]

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def seconds(self, model, batch: int, new_tokens: int) -> float:
        self._sync()
        start = time.perf_counter()
        out = self.generate(model, batch, new_tokens)
        self._sync()
        elapsed = time.perf_counter() - start
        if (generated := self.generated(out)) != new_tokens:
            raise RuntimeError(f"generate returned {generated} tokens, not {new_tokens}")
        return elapsed
