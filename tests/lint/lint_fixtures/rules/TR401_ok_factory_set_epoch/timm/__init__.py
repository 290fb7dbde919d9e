"""A project whose own package has the name of a library the linter knows (as when timm lints itself): the
program's `from timm.data import create_loader` is not followed into this package."""
