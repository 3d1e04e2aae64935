"""Code several benchmark scripts share (flowgp's public API only); the tests do not import it."""
