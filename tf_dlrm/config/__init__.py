"""Plain frozen configuration dataclasses: no TensorFlow, safe to import while parsing flags."""
