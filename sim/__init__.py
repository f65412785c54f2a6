"""Engine performance model, fleet simulator and trace replay."""
