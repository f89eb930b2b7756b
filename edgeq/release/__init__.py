"""Release bundles (``edgeq release``): see ``edgeq.release.bundle``."""
