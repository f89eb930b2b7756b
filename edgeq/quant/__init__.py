"""Quantization: calibration produces scales (``calibrate``); placement decides where Q/DQ go.

``placement`` tags every decision with a rule id from ``rules``; ``qdq`` writes the Q/DQ nodes.
"""
