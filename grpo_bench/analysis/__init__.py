"""The analysis wing: figures (figures.py, drawn as plotting.py says) and REPORT.md (report.py), compare and the gallery (compare.py), FINDINGS.md
(findings.py judges, quantities.py reads per-seed quantities, findings_text.py writes, rule_changes.py says what
v4's rules moved), the kernel and population benchmarks' tables (bench_report.py, bench_population.py). It reads
results directories through the results wing only, and never imports torch.
"""
