"""The upstream client: llhttp (httptools) over non-blocking sockets on trio with a per-worker keep-alive pool."""
