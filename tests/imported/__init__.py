"""Models made elsewhere: a plain ONNX file registered, served by ONNX Runtime, and refused where
it cannot go (MXNet, a training from it)."""
