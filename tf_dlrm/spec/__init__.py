"""The FeatureSpec: NVIDIA's DLRM dataset description, its yaml format and its checks."""
