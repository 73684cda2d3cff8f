"""The two patterns every evaluation needs, each restoring what it changed even when the evaluation fails."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from torch import nn


@contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` in eval mode for the block; its training mode restored afterwards."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


@contextmanager
def forward_hooks(modules: Sequence[nn.Module], hook_for: Callable[[int], Callable]) -> Iterator[None]:
    """``hook_for(i)`` registered as a forward hook on ``modules[i]`` for the block; every handle removed after."""
    handles = [module.register_forward_hook(hook_for(i)) for i, module in enumerate(modules)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
