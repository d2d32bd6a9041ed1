"""NPU runtime."""
