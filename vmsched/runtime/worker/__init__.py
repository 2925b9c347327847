"""The plugin worker process (``python -m vmsched.runtime.worker.main``): confined before any plugin runs.

Standard library only: nothing here may pull pydantic, kombu or prometheus_client into the plugins' interpreter.
"""
