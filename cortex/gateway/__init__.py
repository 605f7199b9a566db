"""The request path: from an HTTP request to a routed, streamed upstream exchange."""
