"""Full-stack misalignment analysis as a tool (paper §3, §4.2 Step 2).

- sweeps: :func:`run_sweeps` (SDPA head_dim, GEMM M/N/K, near-4096 stride-1 TFLOPS, GEMV K/N) and
  :func:`measure_for_targets` (a job's own kernels at its candidate dims), timed by :mod:`.timing`;
- :class:`HardwareProfile`: the versioned result (tidy table + platform metadata), ``save``/``load``;
- :mod:`.cliffs`: cliffs, alignment rules, staircases and Table 2-4-like summaries computed from the data;
- :class:`ProfileFilter`: the :class:`gac.align.candidates.CandidateFilter` that drops cliff dims per target kind;
- :func:`dimension_sweep`: the job's Step 2 (cached per device + software stack);
- :func:`profile_device`: run, save, analyse and plot (what ``experiments/profile_device.py`` calls).
"""

from gac.profiling.cliffs import (
    Rule,
    SweepAnalysis,
    analyze,
    find_cliffs,
    sdpa_backend_table,
    summarize,
    tier_table,
)
from gac.profiling.filter import KIND_SWEEPS, ProfileFilter
from gac.profiling.job_profile import dimension_sweep
from gac.profiling.profile import FORMAT_VERSION, HardwareProfile, load_profile
from gac.profiling.runner import profile_device, write_analysis
from gac.profiling.sweeps import SweepPlan, measure_for_targets, run_sweeps
from gac.profiling.timing import TimingProtocol, time_op

__all__ = [
    "FORMAT_VERSION",
    "KIND_SWEEPS",
    "HardwareProfile",
    "ProfileFilter",
    "Rule",
    "SweepAnalysis",
    "SweepPlan",
    "TimingProtocol",
    "analyze",
    "dimension_sweep",
    "find_cliffs",
    "load_profile",
    "measure_for_targets",
    "profile_device",
    "run_sweeps",
    "sdpa_backend_table",
    "summarize",
    "tier_table",
    "time_op",
    "write_analysis",
]
