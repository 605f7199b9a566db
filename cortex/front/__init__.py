"""The data plane's HTTP/1.1 front: a lean server written on h11 over trio streams."""
