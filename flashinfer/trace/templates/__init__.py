"""One module per API family, each a ``<api>_trace`` TraceTemplate per public API."""
