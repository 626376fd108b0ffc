"""Timing and acceptance statistics, and the analysis of recorded rounds (``ddtree.metrics.rounds``)."""

from ddtree.metrics.accounting import Accounting, ExactAccounting, ReferenceAccounting
from ddtree.metrics.acceptance import mean_of_means, pooled_histogram
from ddtree.metrics.rounds import (
    Calibration,
    DepthRank,
    Estimate,
    RoundTrace,
    branch_gain,
    calibration,
    depth_rank,
    estimate_budget,
    estimate_chain,
    recorded,
    round_traces,
    traces_of,
)
from ddtree.metrics.timer import StageTimer

__all__ = ["Accounting", "Calibration", "DepthRank", "Estimate", "ExactAccounting", "ReferenceAccounting", "RoundTrace",
           "StageTimer", "branch_gain", "calibration", "depth_rank", "estimate_budget", "estimate_chain", "mean_of_means",
           "pooled_histogram", "recorded", "round_traces", "traces_of"]
