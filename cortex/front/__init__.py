"""The data plane's HTTP/1.1 front: a lean server on llhttp (httptools) over trio streams."""
