"""A third-party method module for tests/test_registry.py: registering on import is all a plugin does."""

from harness.engine.method import Method
from harness.registry import register_method


@register_method("plugin_test")
class PluginMethod(Method):
    """A method shipped by another package."""
