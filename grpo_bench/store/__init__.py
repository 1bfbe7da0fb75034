"""The results wing: the one reader and writer of a results directory (rundir.py), every metric declared
once with the margins verdicts use (metrics.py). Nothing here imports torch; the statistics are grpo_bench.stats.
"""
