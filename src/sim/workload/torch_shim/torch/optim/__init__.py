"""torch.optim: Optimizer and AdamW (Flare traces the `step` of every subclass of Optimizer
defined when torch.optim is imported)."""

from torch.optim.optimizer import Optimizer
from torch.optim.adamw import AdamW

__all__ = ["Optimizer", "AdamW"]
