"""ONNX in: loading/saving (``io``), cleaning passes (``passes``), TensorRT 8.6 lint rules (``rules``)."""
