"""SQL92 message selectors (smartgo.filter)."""

from smartgo.filter.sql92 import Selector, SelectorError, compile_selector

__all__ = ["Selector", "SelectorError", "compile_selector"]
