"""The upstream client: h11 over trio streams with a per-worker keep-alive pool."""
