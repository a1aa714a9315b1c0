"""POFE trainers: axolotl trainers whose loss ranks or regresses k responses per prompt."""

from pofe.trainers.rrhf import RRHFTrainer
from pofe.trainers.sppo import SPPOTrainer

__all__ = ["RRHFTrainer", "SPPOTrainer"]
