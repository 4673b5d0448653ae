"""The commands' tests share the benchmark's fake data (``fake_domains``: 50 random 4×4 images of 5 classes
per corruption), so that a grid that gets past its checks runs in a second instead of reading CIFAR-10."""

from tests.bench.conftest import fake_domains  # noqa: F401  (a fixture, found by name)
