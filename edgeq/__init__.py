"""edgeq: ONNX in, INT8 TensorRT 8.6 engine out, and proof of what the engine runs.

The package follows the data path: ``graph`` (ONNX in) -> ``quant`` -> ``remote`` (SSH + agent)
-> ``report`` (engine out) -> ``release``. ``cli`` only parses arguments and renders results.
"""

__version__ = "0.1.0"
