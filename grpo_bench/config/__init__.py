"""The config wing: a run's config (run.py: resolve, validate, hash), an ablation file (ablation.py: grid,
seeds, claims), task presets (presets.py) and YAML as every user file is read (strict_yaml.py).
"""
