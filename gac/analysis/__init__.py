"""Analysis: the paper's tables and figures from the results store (or a W&B export).

    from gac.analysis import load_results, table5, format_table
    df = load_results("results/")                 # tidy: one row per record
    print(format_table(table5(df, model="tiny")))  # Table 5 as markdown ("latex" for LaTeX)

Tables (one module per subject: :mod:`~gac.analysis.method_table` Table 5, :mod:`~gac.analysis.sweeps` the ratio
sweep, :mod:`~gac.analysis.proxies` the proxy comparison and alignment, :mod:`~gac.analysis.seq_latency` latency
by sequence length, :mod:`~gac.analysis.kernel_tables` a kernel profile, :mod:`~gac.analysis.benches` a
side-by-side bench; which records they hold: :mod:`gac.analysis.selection`) return pandas frames
with numbers (NaN where not measured), :mod:`gac.analysis.table_format` renders them as markdown or LaTeX;
figures (:mod:`gac.analysis.figures`) return matplotlib ``Figure`` objects (no pyplot state);
:func:`write_report` writes all of them into a directory (``gac report``).

Every table function takes the frame plus optional filters (``model``, ``gpu``, ``ratio``, ...). A filter left as
``None`` must be unambiguous in the data (one value), otherwise a :class:`GacError` names the values to choose
from; which records may share a table is :mod:`gac.analysis.selection`'s rule (records that differ in a setting are
never mixed; ``where={"align.window": 8}``, ``sweep``, ``experiment`` choose). Numbers stay numbers (NaN where
not run); :func:`gac.analysis.table_format.format_table` renders them, NaN as a blank cell.
"""

from gac.analysis.benches import bench_ratios
from gac.analysis.figures import (
    figure_title,
    kernel_staircase,
    plot_bench_ratios,
    plot_dim_residues,
    plot_dstar_vs_dim,
    plot_latency_vs_seq_len,
    plot_proxy_comparison,
    plot_ratio_sweep,
    save_figure,
)
from gac.analysis.kernel_tables import profile_table, staircase_summary
from gac.analysis.labels import method_label, metric_label
from gac.analysis.load import (
    load_results,
    metric_columns,
    parse_seq_metric,
    parse_target,
    plan_dims,
    records_from_wandb,
    records_to_frame,
)
from gac.analysis.method_table import table5
from gac.analysis.proxies import alignment_table, proxy_comparison, proxy_dims
from gac.analysis.report_dir import Report, show_report, write_report
from gac.analysis.selection import filter_settings, latest_per_key, setting_groups
from gac.analysis.seq_latency import latency_table, latency_vs_seq_len
from gac.analysis.sweeps import ratio_sweep, ratio_sweep_table
from gac.analysis.table_format import format_table

__all__ = [
    "Report",
    "alignment_table",
    "bench_ratios",
    "figure_title",
    "filter_settings",
    "latest_per_key",
    "plot_bench_ratios",
    "plot_dim_residues",
    "plot_dstar_vs_dim",
    "setting_groups",
    "show_report",
    "format_table",
    "kernel_staircase",
    "latency_table",
    "latency_vs_seq_len",
    "load_results",
    "method_label",
    "metric_columns",
    "metric_label",
    "parse_seq_metric",
    "parse_target",
    "plan_dims",
    "plot_latency_vs_seq_len",
    "plot_proxy_comparison",
    "plot_ratio_sweep",
    "profile_table",
    "proxy_comparison",
    "proxy_dims",
    "ratio_sweep",
    "ratio_sweep_table",
    "records_from_wandb",
    "records_to_frame",
    "save_figure",
    "staircase_summary",
    "table5",
    "write_report",
]
