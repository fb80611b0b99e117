"""Building CUDA sources with nvcc."""
