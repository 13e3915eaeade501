"""Managed volumes on a node: the `VolumeDriver` seam (`base`) and one driver per backend."""
