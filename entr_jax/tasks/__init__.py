"""Tasks: rewards/verifiers, environments (single-turn, calculator, local search), rollouts."""
