"""Quantization by the toolkit itself: float IR + weights + a config -> a quantized IR in QDQ form."""
