"""Reusable Qt widgets the panels draw with: heatmaps, token strips, probability bars, plots, legends."""
