"""Where every table lives on N ranks, and what that costs: pure Python, no TensorFlow."""
