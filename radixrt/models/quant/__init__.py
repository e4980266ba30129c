"""Weight quantization formats (FP8 e4m3: fp8.py, its checkpoint formats: checkpoint.py)."""
