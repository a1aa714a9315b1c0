"""Candidate generation, judging and win rates for POFE."""

from .win_rates import bradley_terry_preferences, symmetrize_preferences, win_rates

__all__ = ["win_rates", "symmetrize_preferences", "bradley_terry_preferences"]
