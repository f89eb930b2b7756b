"""Release packaging with a verifiable manifest: not built yet (a later issue); nothing here is imported."""
