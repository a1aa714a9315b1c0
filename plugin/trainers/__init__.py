"""POFE trainers: axolotl trainers whose loss ranks or regresses k responses per prompt."""

from .rrhf import RRHFTrainer
from .sppo import SPPOTrainer

__all__ = ["RRHFTrainer", "SPPOTrainer"]
