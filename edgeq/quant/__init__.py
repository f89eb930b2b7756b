"""Quantization: calibration produces scales (``calibrate``); placement decides where Q/DQ go (``placement``)."""
