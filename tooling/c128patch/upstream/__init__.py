"""Where upstream comes from: the release-wheel history, a local clone or a URL mirror, the cache."""
