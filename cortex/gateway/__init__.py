"""The data plane's front door: from an HTTP request to the serving strategy that answers it
(``proxy``), and the engines' tokenizer endpoints passed to a worker."""
