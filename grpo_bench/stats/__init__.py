"""Inference: pure functions on numbers behind REPORT.md, `compare`, FINDINGS.md and `run --seeds auto`.

Nothing here reads or writes a file; grpo_bench.store reads results and grpo_bench.analysis formats what
these return. By what they compute (docs/statistics.md says why each is done as it is):

    paired.py      two-sample tests on per-seed values (paired t, exact sign-flip, Welch) and Holm
    power.py       power, minimum detectable effects, TOST and the seeds that would decide a row
    crossed.py     seeds x problems as crossed random effects: a held-out accuracy over new seeds and problems
    verdicts.py    one outcome per ordering from the two tests, its interval and its words; `Rules` (v3, v4)
    aggregates.py  rliable's IQM and P(X > Y), a mean's t interval
    fits.py        ScaleRL's saturating curve against compute
    sequential.py  O'Brien-Fleming-type alpha spending for seeds run in batches
"""
from .aggregates import iqm, iqm_ci, mean_ci, prob_improvement, prob_improvement_ci  # noqa: F401
from .crossed import crossed_pair, crossed_seeds, crossed_variance, variance_of_mean  # noqa: F401
from .fits import MIN_POINTS, N_BOOT_FIT, compare_fits, fit_curve, saturating  # noqa: F401
from .paired import (ALPHA, EXACT_MAX, MAX_SEEDS, N_BOOT, N_MC, N_PERM, POWER, holm, holm_levels,  # noqa: F401
                     pearson, sign_flip_p, split_ordering, t_from_summary, two_sample, welch_se)
from .power import (_power_se, mde, mde_se, power, seeds_for_equivalence, seeds_to_detect, tost,  # noqa: F401
                    tost_power)
from .sequential import obf_bounds, sequential_decision, sequential_paired, spend  # noqa: F401
from .verdicts import (NOT_TESTABLE, OUTCOMES, UNCLEAR, V3, V4, Rules, clears, compare_pairs, decide,  # noqa: F401
                       interval, interval_text, judge, power_text, size_unclear, verdict_text, which_test)
