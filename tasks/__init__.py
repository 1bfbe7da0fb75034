"""Task presets (*.yaml) and user reward modules, installed with the package as `grpo_bench_tasks`.

See grpo_bench/config/presets.py for the format; `python -m grpo_bench list` shows every preset.
"""
