"""Every ``cortex_*`` Prometheus metric: the families (``cortex_metrics``), the live objects
read at scrape time (``sources``), the text writer (``text``), the merge of several processes'
expositions (``merge``) and the observer that feeds the request path's events in
(``route_metrics``)."""
