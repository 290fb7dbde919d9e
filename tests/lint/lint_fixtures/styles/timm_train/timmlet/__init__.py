"""A small image-model library laid out like timm: data/ (datasets, transforms, loaders), models/ (a registry
filled by decorators) and utils (seeding, checkpoints)."""

__version__ = "0.1.0"
