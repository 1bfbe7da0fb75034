"""The sweep wing: an ablation's plan and executors (runner.py), the worker API and populations (worker.py),
--seeds auto (sequential.py), the Ray executor (cluster.py) and experiment trackers (trackers.py).
"""
