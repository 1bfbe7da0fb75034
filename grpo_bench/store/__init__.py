"""The results wing: the one reader and writer of a results directory (rundir.py), every metric declared
once (metrics.py), and the statistics of its verdicts (stats.py). Nothing here imports torch.
"""
