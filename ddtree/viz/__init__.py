"""Figures (matplotlib, the optional ``viz`` extra, imported only when a figure is drawn)."""

from ddtree.viz.plots import plot_acceptance_histogram, plot_budget_tradeoff, plot_stage_times
from ddtree.viz.rounds import plot_budget_estimate, plot_calibration, plot_depth_rank
from ddtree.viz.tree import TreeDrawing, draw_round, draw_tree, drawing_of

__all__ = ["TreeDrawing", "draw_round", "draw_tree", "drawing_of", "plot_acceptance_histogram", "plot_budget_estimate",
           "plot_budget_tradeoff", "plot_calibration", "plot_depth_rank", "plot_stage_times"]
