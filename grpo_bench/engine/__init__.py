"""The engine wing: one run's GRPO composition (recipe.py), the loop every task shares (trainer.py), and
optimizers over parameters stacked on a population axis (optim.py).
"""
