"""Bridges from the registry to the training engines users scale with.

    trl.py   GRPOBenchTrainer: TRL's GRPOTrainer with its advantages and loss computed by the registry

Each integration is imported on its own and only needs its engine installed
(`pip install -e .[trl]`); importing this package loads none of them.
"""
