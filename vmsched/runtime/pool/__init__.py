"""The service side of the plugin runtime: the pool of worker processes and how a request's calls reach them."""
