"""Engine out: parse TensorRT engine-inspector JSON and profiles, map layers to ONNX nodes, gate precision."""
