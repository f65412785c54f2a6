"""GPU types known to gpuroute. The numbers (and their sources) live in sim/gpu_profiles.py;
this list is the vocabulary that configuration files are checked against."""

GPU_TYPES: tuple[str, ...] = ("H100", "A100", "L4", "T4", "V100")
