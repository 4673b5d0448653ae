"""The test protocols of the paper (sections 4.1 and 4.3): which samples a run sees, in which order.

* :mod:`zerosiam.protocols.streams`: the streams as pure functions of (labels, seed, parameters) to index
  arrays;
* :mod:`zerosiam.protocols.build`: those streams joined to images (``build_stream``), given a loader;
* :mod:`zerosiam.protocols.seeding`: the one way every draw is seeded, ``rng(seed, purpose, ...)``.

The package sits below the benchmark and imports nothing from it, the methods, the corruptions or the zoo.
"""

from zerosiam.protocols.build import BLIND_SPOT, MIXED, PROTOCOLS, SEQUENCES, Stream, build_stream

__all__ = ["BLIND_SPOT", "MIXED", "PROTOCOLS", "SEQUENCES", "Stream", "build_stream"]
